"""The package's shape: NATS stays inside adapters/nats, adapters never import one another, the
admission core is one plain state machine, the card's speed code stays in card/fast, and every
module says its one concern in its first line.

Nothing in the product disguises how it builds an object: no ``__class__`` assignment, no slot
written through its descriptor.
"""

from __future__ import annotations

import ast
import re
import typing
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PRODUCT = ("plugin", "adapters", "telemetry")
NATS_HOME = ROOT / "adapters" / "nats"
FAST_HOME = ROOT / "plugin" / "card" / "fast"
FAST_PACKAGE = "workerset_admission.card.fast"
# The one module that may try the fast paths: the boundary's entry point, decode_model_record.
FAST_ENTRY = ROOT / "plugin" / "card" / "boundary.py"
# Where each top folder is installed (pyproject's package-dir).
PACKAGE_OF = {
    "plugin": "workerset_admission",
    "adapters": "workerset_admission.adapters",
    "telemetry": "workerset_admission.telemetry",
}
ADMISSION = ROOT / "plugin" / "admission"
# One concern that is read top to bottom, as the contract reads: every step that changes a
# group (cohorts, succession, builds, the hold's, the drain's and the LoRA projection's steps) is
# this one module, whatever its length; the group's records are group.py's, and the hold's and
# the handover's phases change only through their own tables (hold.py, drain.py).
STATE_MACHINE = ADMISSION / "core.py"
GROUP_RECORDS = ADMISSION / "group.py"


def _modules() -> list[Path]:
    return sorted(p for top in PRODUCT for p in (ROOT / top).rglob("*.py"))


def _imported(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
    return names


def _package(path: Path) -> str:
    """The dotted package a product module sits in."""
    top, *folders = path.relative_to(ROOT).parent.parts
    return ".".join([PACKAGE_OF[top], *folders])


def _imported_modules(path: Path) -> set[str]:
    """Every module a file imports, relative imports resolved, ``from m import x`` as m and m.x."""
    package = _package(path).split(".")
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join([*base, *(node.module.split(".") if node.module else [])])
            names.add(module)
            names.update(f"{module}.{alias.name}" for alias in node.names)
    return names


def test_the_walk_finds_the_product_modules() -> None:
    found = {p.relative_to(ROOT).as_posix() for p in _modules()}
    assert {
        "plugin/service/admission_service.py",
        "adapters/nats/source.py",
        "plugin/service/ingest.py",
    } <= found


def test_no_module_outside_adapters_nats_imports_nats() -> None:
    offenders = [
        f"{path.relative_to(ROOT)} imports {name}"
        for path in _modules()
        if NATS_HOME not in path.parents
        for name in sorted(_imported(path))
        if name == "nats" or name.startswith("nats.")
    ]
    assert offenders == []


def test_the_import_walk_sees_an_import_of_nats(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from nats.errors import Error\n    import nats.js\n")
    assert {"nats.errors", "nats.js"} <= _imported(module)


# The modules loose in adapters/ are what several adapters share (the bridges' memory of the
# bucket): any adapter may use them, and they use no adapter.
_SHARED_ADAPTER_MODULES = frozenset(
    p.stem for p in (ROOT / "adapters").glob("*.py") if p.name != "__init__.py"
)


def _foreign_adapters(path: Path, own: str) -> list[str]:
    prefix = "workerset_admission.adapters."
    return sorted(
        name
        for name in _imported(path)
        if name.startswith(prefix)
        and name[len(prefix) :].split(".")[0] != own
        and name[len(prefix) :] not in _SHARED_ADAPTER_MODULES
    )


def test_no_adapter_imports_another_adapter() -> None:
    # What two adapters share lives in the package's own modules (the bucket writer port,
    # Dynamo's store paths) or loose in adapters/ (the bridges' bucket mirror), so each adapter
    # can be read and replaced on its own.
    offenders = [
        f"{path.relative_to(ROOT)} imports {name}"
        for path in _modules()
        if path.relative_to(ROOT).parts[0] == "adapters"
        for name in _foreign_adapters(
            path,
            path.relative_to(ROOT).parts[1] if len(path.relative_to(ROOT).parts) > 2 else "",
        )
    ]
    assert offenders == []
    assert "bucket_mirror" in _SHARED_ADAPTER_MODULES


def test_the_adapter_walk_sees_an_import_of_another_adapter(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("from workerset_admission.adapters.dynamo.bridge import DiscoveryBridge\n")
    assert _foreign_adapters(module, "etcd") == ["workerset_admission.adapters.dynamo.bridge"]
    assert _foreign_adapters(module, "dynamo") == []
    module.write_text("from workerset_admission.adapters.bucket_mirror import BucketMirror\n")
    assert _foreign_adapters(module, "etcd") == []
    assert _foreign_adapters(module, "") == []


@pytest.mark.parametrize("path", _modules(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_product_module_opens_with_one_line_saying_its_concern(path: Path) -> None:
    # One concern per module, said in its first line; its length follows from that concern.
    docstring = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8")), clean=False)
    assert docstring, f"{path.relative_to(ROOT)} has no module docstring"
    first = docstring.strip().splitlines()[0]
    assert first.endswith((".", ":")), f"{path.relative_to(ROOT)}: {first!r} is not one sentence"


# The top of plugin/ shows the architecture: rooms, and only the shared vocabulary loose.
_VOCABULARY = {
    "__init__.py",
    "aio.py",
    "discovery_paths.py",
    "errors.py",
    "identity.py",
    "keys.py",
    "mirror.py",
    "ownership.py",
    "plugin.py",
    "ports.py",
    "routing.py",
    "settings.py",
}
_ROOMS = {
    "admission",
    "card",
    "cli",
    "examples",
    "frontend",
    "rollout",
    "service",
    "traces",
    "view",
    "wiring",
}


def test_the_top_of_the_package_holds_rooms_and_the_shared_vocabulary_only() -> None:
    top = ROOT / "plugin"
    loose = {p.name for p in top.glob("*.py")}
    rooms = {p.name for p in top.iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert loose == _VOCABULARY
    assert len(loose) <= 12
    assert rooms == _ROOMS


# The shared vocabulary and the parts that decide: none of them may lean on an adapter.
_NO_ADAPTERS = ("plugin/settings.py", "plugin/identity.py", "plugin/keys.py", "plugin/errors.py")


@pytest.mark.parametrize(
    "path",
    [
        p
        for p in _modules()
        if p.relative_to(ROOT).as_posix() in _NO_ADAPTERS
        or p.relative_to(ROOT).parts[:2]
        in (("plugin", "admission"), ("plugin", "card"), ("plugin", "view"))
    ],
    ids=lambda p: p.relative_to(ROOT).as_posix(),
)
def test_the_settings_vocabulary_core_and_card_import_no_adapter(path: Path) -> None:
    adapters = sorted(
        name for name in _imported(path) if name.startswith("workerset_admission.adapters")
    )
    assert adapters == []


def test_no_module_outside_card_fast_imports_it_but_the_boundary_entry_point() -> None:
    offenders = [
        f"{path.relative_to(ROOT)} imports {name}"
        for path in _modules()
        if FAST_HOME not in path.parents and path != FAST_ENTRY
        for name in sorted(_imported_modules(path))
        if name == FAST_PACKAGE or name.startswith(FAST_PACKAGE + ".")
    ]
    assert offenders == []
    assert any(name.startswith(FAST_PACKAGE) for name in _imported_modules(FAST_ENTRY))


def test_the_import_walk_resolves_relative_imports_of_card_fast() -> None:
    card = ROOT / "plugin" / "card"
    assert _package(card / "envelope.py") == "workerset_admission.card"
    assert FAST_PACKAGE in _imported_modules(FAST_ENTRY)
    assert "workerset_admission.card.card_facts" in _imported_modules(FAST_HOME / "memo.py")
    assert "workerset_admission.identity" in _imported_modules(FAST_HOME / "memo.py")


_CLASS_ASSIGNMENT = re.compile(r"__class__\s*=(?!=)")
_SLOT_WRITE = re.compile(r"\.__set__\b")


@pytest.mark.parametrize("path", _modules(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_no_product_module_assigns_a_class_or_writes_a_slot_through_its_descriptor(
    path: Path,
) -> None:
    text = path.read_text(encoding="utf-8")
    assert not _CLASS_ASSIGNMENT.search(text)
    assert not _SLOT_WRITE.search(text)


def test_the_construction_check_sees_a_class_assignment_and_a_slot_write() -> None:
    assert _CLASS_ASSIGNMENT.search("effect.__class__ = Placed")
    assert not _CLASS_ASSIGNMENT.search("if value.__class__ == Placed:")
    assert _SLOT_WRITE.search("vars(cls)[name].__set__(made, value)")


def _classes(path: Path) -> list[ast.ClassDef]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return [node for node in ast.walk(tree) if isinstance(node, ast.ClassDef)]


def test_every_state_change_of_a_group_is_in_the_state_machine_module() -> None:
    # The group's records live in group.py and only core.py writes them from outside: no other
    # admission module assigns to a group's, a hold's or a cohort's fields (a record changes its
    # own fields through ``self``, the hold and the handover under their transition tables),
    # or defines a part of the core to inherit.
    assert "class Group:" in GROUP_RECORDS.read_text(encoding="utf-8")
    for path in sorted(ADMISSION.glob("*.py")):
        names = [c.name for c in _classes(path)]
        assert not [n for n in names if n.endswith("Mixin")], path.name
        if path == STATE_MACHINE:
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        writes = [
            target.value.id
            for node in ast.walk(tree)
            if isinstance(node, (ast.Assign, ast.AugAssign))
            for target in (node.targets if isinstance(node, ast.Assign) else [node.target])
            if isinstance(target, ast.Attribute)
            and isinstance(target.value, ast.Name)
            and target.value.id in ("group", "hold", "cohort")
        ]
        assert writes == [], f"{path.name} changes a group's state"


def test_the_admission_core_makes_its_values_one_plain_way() -> None:
    for path in sorted(ADMISSION.glob("*.py")):
        text = path.read_text(encoding="utf-8")
        assert "__class__ =" not in text, path.name
        assert ".__set__" not in text, path.name
        assert "type: ignore" not in text, path.name


# ---------------------------------------------------------------------------------- arrows
#
# Arrows point down: the shared vocabulary and the ports at the bottom; the admission core and
# the card boundary (with the wire records every reader of a bucket shares) on them; adapters on
# those; the service, the traces and the rollout gate above; the composition roots (the service
# factory, the commands, the frontend's routes) at the top, the only modules that see both the
# service and the adapters it is plugged into.

_ROOMS_BELOW_ADAPTERS = ("admission", "card", "view")
# Every other room, a new one included, is above the adapters.
_ROOMS_ABOVE_ADAPTERS = tuple(sorted(_ROOMS - set(_ROOMS_BELOW_ADAPTERS)))
# Where the service is put together with its adapters.
_COMPOSITION_ROOTS = ("plugin/wiring/", "plugin/cli/", "plugin/frontend/")


def _module_names() -> dict[str, Path]:
    """Every product module by dotted name (a package by its own name)."""
    found: dict[str, Path] = {}
    for path in _modules():
        name = _package(path)
        found[name if path.name == "__init__.py" else f"{name}.{path.stem}"] = path
    return found


def _arrows(path: Path, modules: dict[str, Path], text: str | None = None) -> set[str]:
    """The product modules a file imports: anywhere in it, for types only or at run time.

    ``from package import name`` points at the submodule when ``name`` is one, else at the
    package; an import of a name inside a module points at that module. ``text`` stands in
    for the file's own.
    """
    package = _package(path).split(".")
    found: set[str] = set()
    source = path.read_text(encoding="utf-8") if text is None else text
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join([*base, *(node.module.split(".") if node.module else [])])
            targets = [
                f"{module}.{alias.name}" if f"{module}.{alias.name}" in modules else module
                for alias in node.names
            ]
        else:
            continue
        for target in targets:
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target:
                found.add(target)
    return found


def _graph() -> dict[str, set[str]]:
    modules = _module_names()
    return {name: _arrows(path, modules) - {name} for name, path in modules.items()}


def _room(name: str) -> str:
    parts = name.split(".")
    if parts[1:2] == ["adapters"]:
        return "adapters"
    return parts[1] if len(parts) > 1 else ""


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected set of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_no_import_cycle_in_product_code() -> None:
    # Imports for types only count too: a cycle read by a type checker is read by people.
    assert _cycles(_graph()) == []


def test_the_cycle_check_finds_a_cycle_and_only_a_cycle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_the_arrow_walk_sees_imports_for_types_and_inside_functions() -> None:
    modules = _module_names()
    readout = ROOT / "plugin" / "admission" / "readout.py"
    assert "workerset_admission.admission.snapshots" in _arrows(readout, modules)
    text = (
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from workerset_admission.admission.core import _Group\n"
        "def f():\n    from . import effects\n"
    )
    # As if this text were readout's: a type-only import and a relative one in a function.
    assert _arrows(readout, modules, text) == {
        "workerset_admission.admission.core",
        "workerset_admission.admission.effects",
    }


def test_the_core_and_its_readout_point_one_way() -> None:
    graph = _graph()
    assert "workerset_admission.admission.readout" in graph["workerset_admission.admission.core"]
    assert (
        "workerset_admission.admission.core" not in graph["workerset_admission.admission.readout"]
    )


def test_ports_hold_protocols_and_the_values_that_cross_them_only() -> None:
    ports = ROOT / "plugin" / "ports.py"
    rooms = {_room(name) for name in _graph()["workerset_admission.ports"]}
    assert rooms <= {"identity", "errors"}, rooms
    for node in _classes(ports):
        bases = {ast.unparse(b) for b in node.bases}
        decorators = {ast.unparse(d).split("(")[0] for d in node.decorator_list}
        value = "NamedTuple" in bases or "dataclass" in decorators
        assert "Protocol" in bases or value, f"ports.{node.name} is an implementation"
        if value:
            methods = [
                f.name
                for f in node.body
                if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
                and not f.name.startswith("__")
                and "property" not in {ast.unparse(d) for d in f.decorator_list}
            ]
            assert methods == [], f"ports.{node.name} does more than carry values: {methods}"


def test_adapters_never_import_the_rooms_above_them() -> None:
    offenders = [
        f"{name} imports {target}"
        for name, targets in _graph().items()
        if _room(name) == "adapters"
        for target in sorted(targets)
        if _room(target) in _ROOMS_ABOVE_ADAPTERS
    ]
    assert offenders == []


def test_the_rooms_above_the_adapters_are_every_room_but_the_core_and_the_card() -> None:
    assert {"service", "traces", "cli", "frontend", "rollout"} <= set(_ROOMS_ABOVE_ADAPTERS)
    assert _room("workerset_admission.rollout.gate") in _ROOMS_ABOVE_ADAPTERS
    assert _room("workerset_admission.card.serving_record") not in _ROOMS_ABOVE_ADAPTERS


def test_only_a_composition_root_sees_the_adapters_from_above() -> None:
    modules = _module_names()
    offenders = [
        f"{modules[name].relative_to(ROOT)} imports {target}"
        for name, targets in _graph().items()
        if _room(name) in ("service", "traces", "telemetry", "admission", "card", "view", "rollout")
        and not modules[name].relative_to(ROOT).as_posix().startswith(_COMPOSITION_ROOTS)
        for target in sorted(targets)
        if _room(target) == "adapters"
    ]
    assert offenders == []


def test_the_arrow_rules_see_an_arrow_that_runs_back_up() -> None:
    assert _room("workerset_admission.adapters.dynamo.hop") == "adapters"
    assert _room("workerset_admission.service.bindings") == "service"
    assert _room("workerset_admission.ports") == "ports"
    graph = _graph()
    assert any(_room(t) == "adapters" for t in graph["workerset_admission.wiring.compose"])
    assert _rank("workerset_admission.traces.writer") > _rank("workerset_admission.service.step")
    assert _rank("workerset_admission.wiring.compose") > _rank("workerset_admission.traces.writer")
    assert _rank("workerset_admission.settings") > _rank("workerset_admission.admission.core")


# Every module in a layer, lowest first: an arrow points to a lower layer or within its own.
# The loose vocabulary is split by what it leans on: most of it on nothing of the project;
# the settings, Dynamo's store paths and the package's face on the core's and the card's
# names, below the adapters that read them. The view's plan reads the card's record keys and is
# read by the adapter that writes the view's directory. The service is told of its trace, view and
# publishers as observers and ports, so it imports neither the adapters nor traces/; traces/
# reads the service's step; the composition roots see everything.
_LAYERS = (
    ("identity", "errors", "keys", "ports", "aio", "routing", "ownership", "mirror", "examples"),
    ("admission", "card"),
    ("view",),
    ("settings", "discovery_paths", ""),
    ("adapters", "telemetry"),
    ("service",),
    ("traces", "rollout"),
    ("cli", "frontend", "wiring", "plugin"),
)


def _rank(name: str) -> int:
    room = _room(name)
    for rank, rooms in enumerate(_LAYERS):
        if room in rooms:
            return rank
    raise AssertionError(f"{name} is in no layer; add its room to _LAYERS")


def test_every_module_is_in_a_layer() -> None:
    for name in _graph():
        _rank(name)
    assert _room("workerset_admission") == ""


def test_no_arrow_runs_back_up() -> None:
    offenders = [
        f"{name} imports {target}"
        for name, targets in _graph().items()
        for target in sorted(targets)
        if _rank(target) > _rank(name)
    ]
    assert offenders == []


def test_the_service_imports_no_adapter_and_no_trace() -> None:
    offenders = [
        f"{name} imports {target}"
        for name, targets in _graph().items()
        if _room(name) == "service"
        for target in sorted(targets)
        if _room(target) in ("adapters", "traces")
    ]
    assert offenders == []


def test_each_port_and_the_routable_rule_are_declared_once() -> None:
    ports = {node.name for node in _classes(ROOT / "plugin" / "ports.py")}
    twins = [
        f"{path.relative_to(ROOT)}: {node.name}"
        for path in _modules()
        if path != ROOT / "plugin" / "ports.py"
        for node in _classes(path)
        if node.name in ports
    ]
    assert twins == []
    rules = [
        path.relative_to(ROOT).as_posix()
        for path in _modules()
        if "def routable_ids(" in path.read_text(encoding="utf-8")
    ]
    assert rules == ["plugin/admission/admitted.py"]


def _prefix_literals(text: str) -> list[str]:
    """The string constants of a module that spell a discovery key prefix (``"v1.mdc."``)."""
    return [
        node.value
        for node in ast.walk(ast.parse(text))
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and re.fullmatch(r"v1\.[a-z_]+\.", node.value)
    ]


def test_what_an_entry_is_is_told_by_the_boundary_alone() -> None:
    # The key prefixes are spelled in keys.py (and in card/, which owns the record kinds);
    # ingestion and the rest of the service ask card/entry.py what an entry is.
    offenders = {
        path.relative_to(ROOT).as_posix(): found
        for path in _modules()
        if path.relative_to(ROOT).parts[:2] in (("plugin", "service"), ("plugin", "traces"))
        if (found := _prefix_literals(path.read_text(encoding="utf-8")))
    }
    assert offenders == {}
    assert _prefix_literals((ROOT / "plugin" / "keys.py").read_text(encoding="utf-8"))
    assert _prefix_literals('if key.startswith("v1.drain."):\n    pass\n') == ["v1.drain."]


# -------------------------------------------------------------------------------- the effect bus
#
# Effects are dispatched once, by the step's table: each effect type to the one method that
# carries it out, which calls one typed method of one part. No product module asks an effect
# its type itself (``isinstance``, ``type(e) is``, a class pattern in ``match``); telemetry
# reads a step's effects as a list, through its own tables keyed by type.

STEP = ROOT / "plugin" / "service" / "step.py"


def _effect_names() -> frozenset[str]:
    from workerset_admission.admission import Effect

    return frozenset(t.__name__ for t in typing.get_args(Effect))


def _named(node: ast.expr) -> set[str]:
    """The class names an expression spells (``X``, ``fx.X``, a tuple of them)."""
    return {
        n.id if isinstance(n, ast.Name) else n.attr
        for n in ast.walk(node)
        if isinstance(n, (ast.Name, ast.Attribute))
    }


def _effect_type_tests(text: str, names: frozenset[str]) -> list[int]:
    """The lines of ``text`` that test a value against an effect type."""
    lines = []
    for node in ast.walk(ast.parse(text)):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "isinstance"
            and len(node.args) == 2
        ):
            subject = node.args[0]
            if _named(node.args[1]) & names or (
                isinstance(subject, ast.Name) and subject.id == "effect"
            ):
                lines.append(node.lineno)
        elif isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            typed = any(
                isinstance(o, ast.Call) and isinstance(o.func, ast.Name) and o.func.id == "type"
                for o in operands
            )
            spelled = any(
                isinstance(o, (ast.Name, ast.Attribute)) and _named(o) & names for o in operands
            )
            if typed and spelled:
                lines.append(node.lineno)
        elif isinstance(node, ast.MatchClass) and _named(node.cls) & names:
            lines.append(node.cls.lineno)
    return sorted(lines)


def test_effects_are_dispatched_in_the_step_only() -> None:
    names = _effect_names()
    offenders = {
        str(path.relative_to(ROOT)): found
        for path in _modules()
        if path != STEP
        if (found := _effect_type_tests(path.read_text(encoding="utf-8"), names))
    }
    assert offenders == {}, "a second dispatch on effect types; carry effects out in the step"


def test_the_steps_table_names_a_carrier_for_every_effect_type() -> None:
    from workerset_admission.admission import Effect
    from workerset_admission.service.step import CARRIERS

    assert set(CARRIERS) == set(typing.get_args(Effect))
    # The table is the dispatch: the step keeps no chain of type tests beside it.
    assert _effect_type_tests(STEP.read_text(encoding="utf-8"), _effect_names()) == []


def test_the_dispatch_check_sees_every_way_of_asking_an_effect_its_type() -> None:
    names = _effect_names()
    seen = _effect_type_tests(
        "isinstance(effect, object)\n"
        "isinstance(e, fx.CommitGroup)\n"
        "isinstance(e, (int, OpenReceiver))\n"
        "type(e) is WorkerPlaced\n"
        "match e:\n"
        "    case StartBuild():\n"
        "        pass\n"
        "isinstance(event, WorkerRemoved)\n",
        names,
    )
    assert seen == [1, 2, 3, 4, 6]


# -------------------------------------------------------------------- the view never judges

_CARD_DECODERS = frozenset(
    {"decode_model_record", "decode_endpoint_record", "decode_event_record", "decode_plain_model"}
)
DYNAMO_HOME = ROOT / "adapters" / "dynamo"


def _card_decoders_used(source: str) -> set[str]:
    """The card decoders a module imports or reaches by attribute (``card.decode_...``)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.update(part for alias in node.names for part in alias.name.split("."))
        elif isinstance(node, ast.Attribute):
            found.add(node.attr)
        elif isinstance(node, ast.Name):
            found.add(node.id)
    return found & _CARD_DECODERS


def test_the_dynamo_adapters_never_decode_a_record_the_boundary_judged() -> None:
    # The view publishes the raw bytes the service's ingestion accepted; it files them by key.
    found = {
        path.relative_to(ROOT).as_posix(): sorted(used)
        for path in sorted(DYNAMO_HOME.rglob("*.py"))
        if (used := _card_decoders_used(path.read_text(encoding="utf-8")))
    }
    assert found == {}


def test_the_decoder_check_sees_an_import_and_an_attribute() -> None:
    assert _card_decoders_used("from workerset_admission.card import decode_model_record\n") == {
        "decode_model_record"
    }
    assert _card_decoders_used("import x\nx.decode_event_record(1)\n") == {"decode_event_record"}
    assert _card_decoders_used("from workerset_admission.card import parse_key\n") == set()


def test_the_entry_points_name_the_composition_root_and_the_route_extension() -> None:
    # pyproject.toml is what an installed host reads; each entry point must import and be
    # the object the package says it is.
    import importlib

    from workerset_admission.frontend.routes import frontend_routes
    from workerset_admission.wiring.compose import create_service

    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    found = dict(re.findall(r'^(?:admission|workerset-admission) = "([\w.]+):(\w+)"$', text, re.M))
    assert found == {
        "workerset_admission.wiring.compose": "create_service",
        "workerset_admission.frontend.routes": "frontend_routes",
        "workerset_admission.cli": "main",
    }
    for module, name in found.items():
        assert callable(getattr(importlib.import_module(module), name))
    assert create_service.__module__ == "workerset_admission.wiring.compose"
    assert frontend_routes.__module__ == "workerset_admission.frontend.routes"
