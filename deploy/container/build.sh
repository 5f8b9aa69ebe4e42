#!/usr/bin/env bash
# Builds the images of deploy/container/ and deploy/kubernetes/ with podman, without any
# container registry.
#
#   deploy/container/build.sh [tools|frontend|mocker|worker ...]     all four when none is named
#
# The base: BASE when it is set (a Python 3.10 to 3.13 image with venv, for example
# docker.io/library/python:3.11-slim-bookworm where a registry is reachable); otherwise a Debian 12
# root file system made by mmdebstrap from Debian's packages (python3, python3-venv, python3-pip,
# ca-certificates) and imported as localhost/workerset-admission-base:bookworm-<recipe hash>. It
# is made once: a later run finds the image in podman's store and reuses it.
#
# The wheels: built on this host by `pip wheel` with $PYTHON (default python3, which must have the
# base's Python minor version; the host's pip settings and index apply), then installed in the
# image with `pip install --no-index` from the build context, in a build run with --network=none:
# the image build reaches no index and no registry. The dependencies' wheels are kept under the
# engine folder while pyproject.toml's dependency lists stay the same; the project's own wheel
# is built every time (the same code gives the same bytes, so podman's layer cache holds).
#
# Podman runs with the settings and image store of integration/container-engine.sh in
# ENGINE_DIR (default: the checkout's git-ignored .containers/, the store the tests use; the
# settings are written there when missing: runc, ulimits within this machine's limits); with
# ENGINE_DIR=system, with podman's own settings. A plain `podman run` reads podman's own store,
# not ENGINE_DIR's: run the images with the same two variables the script sets (it prints the
# command at the end), or build with ENGINE_DIR=system to put them in podman's own store.
#
# Images: localhost/workerset-admission:<version> (tools: serve, bridge and the other commands),
# localhost/workerset-admission-frontend:<version> (the Dynamo 1.6.1 frontend with the plugin
# as a route extension), localhost/workerset-admission-mocker:<version> (Dynamo's mocker worker,
# a stand-in worker image; needs the frontend image) and localhost/workerset-admission-worker:
# <version> (deploy/kubernetes/Containerfile.worker: WORKER_IMAGE, default the mocker image, with
# workerset-admission added for the preStop hook; its wheels are built with $PYTHON, which must
# have the worker image's Python minor version), each also tagged latest; their build stages
# are tagged <image>-build.
# Every step prints how long it took, and each image its size.
set -euo pipefail

HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
PYTHON="${PYTHON:-python3}"
ENGINE_DIR="${ENGINE_DIR:-${WORKERSET_ADMISSION_ENGINE_DIR:-$ROOT/.containers}}"
DEBIAN_MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
DEBIAN_SECURITY="${DEBIAN_SECURITY:-http://deb.debian.org/debian-security}"
BASE_PACKAGES="python3,python3-venv,python3-pip,ca-certificates"
DYNAMO_VERSION=1.6.1

say() { echo "build.sh: $*" >&2; }
fail() {
    say "$*"
    exit 1
}

targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(tools frontend mocker worker)
for target in "${targets[@]}"; do
    case "$target" in
    tools | frontend | mocker | worker) ;;
    *) fail "unknown image '$target' (tools, frontend, mocker or worker)" ;;
    esac
done

if [ "$ENGINE_DIR" != system ]; then
    # Installs podman and runc when missing (as root), as the tests' engine does.
    bash "$ROOT/integration/container-engine.sh" settings "$ENGINE_DIR" || fail "no podman settings"
    export CONTAINERS_CONF="$ENGINE_DIR/containers.conf"
    export CONTAINERS_STORAGE_CONF="$ENGINE_DIR/storage.conf"
    CACHE="$ENGINE_DIR/build"
else
    command -v podman >/dev/null || fail "podman is needed (apt-get install podman runc)"
    CACHE="$ROOT/.containers/build"
fi
mkdir -p "$CACHE"

# Runs pip quietly (its build warnings go to a log shown only when it fails). $1: the log.
pip_quiet() {
    local log="$1"
    shift
    if ! "$PYTHON" -m pip --disable-pip-version-check "$@" >"$log" 2>&1; then
        tail -n 20 "$log" >&2
        return 1
    fi
}

# Runs a step and prints its duration. $1: what it is; the rest: the command.
timed() {
    local what="$1" started=$SECONDS
    shift
    "$@" || fail "$what: failed"
    say "$what: $((SECONDS - started)) s"
}

make_base() {
    # $1: the image to make. The recipe's hash names it, so a changed recipe makes a new one.
    local rootfs="$CACHE/base-rootfs.tar"
    if ! command -v mmdebstrap >/dev/null; then
        if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
            fail "mmdebstrap is needed to make the base (apt-get install mmdebstrap), or set BASE"
        fi
        say "installing mmdebstrap from the system's packages"
        { apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
            apt-get install -y -qq --no-install-recommends mmdebstrap; } >"$CACHE/apt.log" 2>&1 \
            || fail "apt-get install mmdebstrap failed, see $CACHE/apt.log"
    fi
    # Documentation and translations are left out; the package lists are dropped at the end
    # (the image installs nothing from apt later). The hook's $1 is mmdebstrap's, not ours.
    # shellcheck disable=SC2016
    mmdebstrap --quiet --variant=apt --include="$BASE_PACKAGES" \
        --dpkgopt='path-exclude=/usr/share/doc/*' \
        --dpkgopt='path-include=/usr/share/doc/*/copyright' \
        --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/locale/*' \
        --customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*' \
        bookworm "$rootfs" \
        "deb $DEBIAN_MIRROR bookworm main" \
        "deb $DEBIAN_MIRROR bookworm-updates main" \
        "deb $DEBIAN_SECURITY bookworm-security main" \
        || fail "mmdebstrap failed"
    podman import --quiet --change 'ENV LANG=C.UTF-8' --change 'CMD ["python3"]' \
        "$rootfs" "$1" >/dev/null || fail "podman import of the base failed"
    rm -f "$rootfs"
}

base_image() {
    if [ -n "${BASE:-}" ]; then
        say "base: $BASE (from BASE)"
        echo "$BASE"
        return
    fi
    local recipe tag
    recipe="$(printf '%s\n' bookworm "$BASE_PACKAGES" "$DEBIAN_MIRROR" "$DEBIAN_SECURITY" |
        sha256sum | cut -c1-12)"
    tag="localhost/workerset-admission-base:bookworm-$recipe"
    if podman image exists "$tag"; then
        say "base: $tag (already made)"
    else
        timed "base $tag made by mmdebstrap from Debian's packages" make_base "$tag"
    fi
    echo "$tag"
}

# The project's wheel, in $CACHE/project/, and the clean copy of what the package is made of
# that the wheels are built from, in $CACHE/src/ (setuptools' build/ folder in the checkout may
# still hold a module since removed, which would go in).
make_project_wheel() {
    rm -rf "$CACHE/src" "$CACHE/project"
    mkdir -p "$CACHE/src" "$CACHE/project"
    cp -r "$ROOT"/{pyproject.toml,README.md,LICENSE,plugin,adapters,telemetry} "$CACHE/src/"
    find "$CACHE/src" -name __pycache__ -prune -exec rm -rf {} +
    # A fixed time stamp in the wheel: the same code makes the same bytes, and podman's layer
    # cache then reuses the layer that installs it.
    SOURCE_DATE_EPOCH=315532800 \
        pip_quiet "$CACHE/pip.log" wheel --no-deps -w "$CACHE/project" "$CACHE/src" ||
        fail "pip wheel of the project failed"
}

# The dependencies' wheels of one image. $1: target, $2: its extras, $3: the folder.
make_deps() {
    rm -rf "$3"
    mkdir -p "$3"
    pip_quiet "$3/../pip.log" wheel -w "$3" "$CACHE/src${2:+[$2]}" ||
        fail "pip wheel of the $1 dependencies failed"
    if [ "$1" = frontend ]; then
        # ai-dynamo pins aisimulate, which cannot be installed; the frontend never imports it,
        # so ai-dynamo goes in alone (its real dependencies come with the dynamo extra).
        pip_quiet "$3/../pip.log" wheel --no-deps -w "$3" "ai-dynamo==$DYNAMO_VERSION" ||
            fail "pip wheel of ai-dynamo failed"
    fi
    rm -f "$3"/dynamo_workerset_admission-*.whl
}

# The build context of a target's image, $CACHE/<target>/: deps/, the dependencies' wheels
# (kept while pyproject.toml's dependency lists and the Python version stay the same), and
# project/, the project's wheel. $1: target, $2: the image's Python minor version.
make_context() {
    local target="$1" minor="$2" extras context key
    case "$target" in
    tools) extras="embedded,etcd" ;;
    frontend) extras="dynamo" ;;
    worker) extras="" ;;
    esac
    context="$CACHE/$target"
    # The dependency lists of pyproject.toml (not its other settings), the extras and Python.
    key="$({ sed -n '/^dependencies = \[/,/^\[project.scripts\]/p' "$ROOT/pyproject.toml"
        echo "$extras $minor $DYNAMO_VERSION"; } | sha256sum | cut -c1-16)"
    if [ "$(cat "$context/deps/.key" 2>/dev/null)" = "$key" ]; then
        say "$target dependencies' wheels: kept from an earlier build ($context/deps)"
    else
        timed "$target dependencies' wheels (pip wheel on the host)" \
            make_deps "$target" "$extras" "$context/deps"
        echo "$key" >"$context/deps/.key"
    fi
    rm -rf "$context/project"
    cp -r "$CACHE/project" "$context/project"
}

# The build stage is tagged too ($image-build): its layers (the dependencies installed) stay
# referenced, so the pruning of the images a rebuild replaced keeps them for the next build.
# $1: target, $2: image, $3: base (for the worker: the worker image it is built on).
build_image() {
    local recipe="$HERE/Containerfile.$1" context="$CACHE/$1"
    local args=(--build-arg "BASE=$3" --build-arg "VERSION=$VERSION")
    case "$1" in
    mocker)
        # Nothing to copy in: the mocker's environment comes from the frontend image.
        mkdir -p "$context"
        args+=(--build-arg "FRONTEND=$FRONTEND_IMAGE:$VERSION")
        podman build --quiet --network=none "${args[@]}" -f "$recipe" \
            -t "$2:$VERSION" -t "$2:latest" "$context" >/dev/null
        return
        ;;
    worker)
        recipe="$ROOT/deploy/kubernetes/Containerfile.worker"
        args=(--build-arg "WORKER_IMAGE=$3" --build-arg "VERSION=$VERSION")
        ;;
    esac
    local common=(build --quiet --network=none "${args[@]}" -f "$recipe")
    podman "${common[@]}" --target build -t "$2-build:latest" "$context" >/dev/null &&
        podman "${common[@]}" -t "$2:$VERSION" -t "$2:latest" "$context" >/dev/null
}

# The Python minor version of an image's python3. $1: the image.
python_minor() {
    podman run --rm --network=none --entrypoint python3 "$1" -c \
        'import sys; print("%d.%d" % sys.version_info[:2])'
}

VERSION="$(sed -n 's/^version = "\(.*\)"$/\1/p' "$ROOT/pyproject.toml" | head -n 1)"
FRONTEND_IMAGE=localhost/workerset-admission-frontend
MOCKER_IMAGE=localhost/workerset-admission-mocker
host_minor="$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])')" \
    || fail "cannot run $PYTHON"

started=$SECONDS
base="$(base_image)"
image_minor="$(python_minor "$base")" || fail "cannot run python3 in $base"
[ "$host_minor" = "$image_minor" ] \
    || fail "$PYTHON is Python $host_minor but $base has $image_minor: set PYTHON to a $image_minor"

timed "project wheel (pip wheel on the host)" make_project_wheel
for target in "${targets[@]}"; do
    on="$base"
    case "$target" in
    tools) image=localhost/workerset-admission ;;
    frontend) image=$FRONTEND_IMAGE ;;
    mocker)
        image=$MOCKER_IMAGE
        podman image exists "$FRONTEND_IMAGE:$VERSION" ||
            fail "the mocker image is made from $FRONTEND_IMAGE:$VERSION: build frontend first"
        ;;
    worker)
        image=localhost/workerset-admission-worker
        on="${WORKER_IMAGE:-$MOCKER_IMAGE:$VERSION}"
        podman image exists "$on" || fail "no worker image $on here (set WORKER_IMAGE, or build mocker)"
        worker_minor="$(python_minor "$on")" || fail "cannot run python3 in $on"
        [ "$host_minor" = "$worker_minor" ] ||
            fail "$PYTHON is Python $host_minor but $on has $worker_minor: set PYTHON to a $worker_minor"
        say "worker image built on $on"
        ;;
    esac
    [ "$target" = mocker ] || make_context "$target" "$image_minor"
    timed "$target image $image:$VERSION" build_image "$target" "$image" "$on"
    size="$(podman image inspect --format '{{.Size}}' "$image:$VERSION")"
    say "$target image $image:$VERSION: $((size / 1000000)) MB"
done
# What the rebuilds replaced (untagged, used by no other image); never a tagged image.
podman image prune -f >/dev/null
rm -rf "$CACHE/src"
say "done in $((SECONDS - started)) s"
if [ "$ENGINE_DIR" != system ]; then
    say "the images are in the store of $ENGINE_DIR, which a plain podman does not read; run them as"
    say "  CONTAINERS_CONF=$CONTAINERS_CONF CONTAINERS_STORAGE_CONF=$CONTAINERS_STORAGE_CONF podman run --rm localhost/workerset-admission:$VERSION --help"
    say "or build with ENGINE_DIR=system to put them in podman's own store"
fi
