"""The router policy file a card names in ``router_config``: read and checked at decode time."""

from __future__ import annotations

from typing import Any

from workerset_admission.card.schema import Ctx, Refused

__all__ = ["policy_file"]


def _read(ctx: Ctx, path: str) -> bytes:
    if ctx.read_file is not None:
        return ctx.read_file(path)
    with open(path, "rb") as handle:
        return handle.read()


def policy_file(value: Any, ctx: Ctx) -> Any:
    # 1.6.1 loads the named policy file while decoding; an unreadable file refuses the card.
    if value is None:
        return None
    try:
        data = _read(ctx, value)
    except OSError as exc:
        raise Refused(
            "router_policy_config", f"failed to read router policy config {value}: {exc}"
        ) from None
    _check_policy_yaml(data, value)
    return value


_POLICY_KEYS = frozenset(
    {
        "router",
        "default_policy_family",
        "policy_classes",
        "uncached_isl_buckets",
        "models",
        "worker_selection",
        "request_classifier",
    }
)
_ROOT_PROFILE = ("default_policy_family", "uncached_isl_buckets", "policy_classes")
_SELECTION_ROLES = frozenset({"aggregated", "prefill", "decode", "encode", "instances"})


def _check_policy_yaml(data: bytes, path: str) -> None:
    """Check a router policy file the way 1.6.1 does, as far as its top level goes.

    The file is YAML; its top level is a struct with a fixed key set (repeats refused), and it
    must define router settings, a root profile, a model profile, ``worker_selection`` or a
    ``request_classifier``. Router settings must be a mapping; 1.6.1 knows no setting we have
    seen a card use, so a non-empty one is refused. Profiles, worker selection and the request
    classifier are checked at their top level only (their inner schema is 1.6.1's own).
    """
    try:
        import yaml
    except ImportError:  # pragma: no cover - PyYAML ships with the Dynamo runtime
        return
    problem = "invalid_router_policy"

    class _Loader(yaml.SafeLoader):
        pass

    def mapping(loader: Any, node: Any, deep: bool = False) -> Any:
        keys = [loader.construct_object(k, deep=deep) for k, _ in node.value]
        hashable = [k for k in keys if isinstance(k, (str, int, float, bool)) or k is None]
        if len(set(hashable)) != len(hashable):
            raise yaml.constructor.ConstructorError(None, None, "duplicate field", node.start_mark)
        return yaml.SafeLoader.construct_mapping(loader, node, deep)

    _Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, mapping)
    try:
        parsed = yaml.load(data.decode("utf-8"), Loader=_Loader)
    except (UnicodeDecodeError, yaml.YAMLError) as exc:
        raise Refused(problem, f"failed to parse router policy config {path}: {exc}") from None
    if parsed is None:
        parsed = {}
    if not isinstance(parsed, dict):
        raise Refused(problem, f"router policy config {path} is not a mapping")
    unknown = [k for k in parsed if k not in _POLICY_KEYS]
    if unknown:
        raise Refused(problem, f"unknown field {unknown[0]!r} in router policy config {path}")
    router = parsed.get("router")
    if router is not None:
        if not isinstance(router, dict):
            raise Refused(problem, "router: expected a map")
        if router:
            raise Refused(problem, f"unknown router setting: {next(iter(router))}")
    root = [k for k in _ROOT_PROFILE if parsed.get(k) is not None]
    if root and len(root) != len(_ROOT_PROFILE):
        raise Refused(problem, "root profile must specify all of " + ", ".join(_ROOT_PROFILE))
    if root:
        _check_profile(parsed, "root profile", problem)
    models = parsed.get("models", {})
    if not isinstance(models, dict):
        raise Refused(problem, "models: expected a map")
    for name, profile in models.items():
        if not name:
            raise Refused(problem, "model profile name must not be empty")
        if not isinstance(profile, dict) or "default_policy_family" not in profile:
            raise Refused(problem, f"models.{name}: missing field `default_policy_family`")
        _check_profile(profile, f"models.{name}", problem)
    selection = parsed.get("worker_selection")
    if selection is not None:
        if not isinstance(selection, dict):
            raise Refused(problem, "worker_selection: expected a map")
        for role, value in selection.items():
            if role not in _SELECTION_ROLES:
                raise Refused(problem, f"worker_selection: unknown field `{role}`")
            if role != "instances" and value is not None and not isinstance(value, str):
                raise Refused(problem, f"worker_selection.{role}: expected a string")
        if all(value is None for value in selection.values()):
            raise Refused(problem, "worker_selection must define a selection")
    classifier = parsed.get("request_classifier")
    if classifier is not None and (not isinstance(classifier, dict) or "type" not in classifier):
        raise Refused(problem, "request_classifier: missing field `type`")
    defined = router is not None or bool(root) or bool(models) or selection is not None
    if not defined and classifier is None:
        raise Refused(problem, "router policy config must define something")


def _check_profile(profile: dict[str, Any], where: str, problem: str) -> None:
    classes = profile.get("policy_classes")
    if classes is not None and not isinstance(classes, list):
        raise Refused(problem, f"{where}: policy_classes must be a sequence")
