#!/usr/bin/env bash
# Prepare this checkout on a fresh Debian/Ubuntu machine: system packages, then a virtual environment at .venv
# with farm installed in editable mode with every extra (farm[all]: worker, OpenCL, Flower) and its test tools.
# Safe to run again: it only does what is missing.
#
# Environment:
#   FARM_SKIP_APT=1        do not touch system packages (no apt-get at all)
#   FARM_FORCE_INSTALL=1   re-run the pip install even if pyproject.toml has not changed since the last one
#   PYTHON=python3.X       interpreter used to create .venv (default: python3)
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
REPO_ROOT="$(pwd)"
PYTHON="${PYTHON:-python3}"
VENV="$REPO_ROOT/.venv"
# qemu-user-static and the targets' C libraries run cross-compiled targets (farm run --target cpu:aarch64-linux-gnu,
# cpu:riscv64-linux-gnu) under emulation: the tests check every cross target's outputs that way, and run farm on an
# emulated AVX2-only CPU (qemu-x86_64-static -cpu EPYC-Milan, tests/test_hosts.py).
APT_PACKAGES=(redis-server pocl-opencl-icd ocl-icd-libopencl1 clinfo lld binutils python3-venv
              qemu-user-static libc6-arm64-cross libc6-riscv64-cross)

say() { printf '[setup] %s\n' "$*"; }

# --- system packages -------------------------------------------------------------------------------------------
if [ "${FARM_SKIP_APT:-0}" = "1" ]; then
    say "FARM_SKIP_APT=1: skipping system packages"
elif ! command -v apt-get >/dev/null 2>&1; then
    say "apt-get not found: not a Debian/Ubuntu machine; install by hand: ${APT_PACKAGES[*]}"
else
    missing=()
    for pkg in "${APT_PACKAGES[@]}"; do
        if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed'; then
            missing+=("$pkg")
        fi
    done
    if [ "${#missing[@]}" -eq 0 ]; then
        say "system packages already installed: ${APT_PACKAGES[*]}"
    else
        if [ "$(id -u)" -eq 0 ]; then
            SUDO=()
        elif command -v sudo >/dev/null 2>&1; then
            SUDO=(sudo)
        else
            echo "[setup] error: not root and sudo is not available; cannot install: ${missing[*]}" >&2
            echo "[setup] install them by hand, then re-run with FARM_SKIP_APT=1" >&2
            exit 1
        fi
        say "installing system packages: ${missing[*]}"
        say "+ ${SUDO[*]:+${SUDO[*]} }apt-get update"
        "${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update
        say "+ ${SUDO[*]:+${SUDO[*]} }apt-get install -y ${APT_PACKAGES[*]}"
        "${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y "${APT_PACKAGES[@]}"
    fi
fi

# --- virtual environment ---------------------------------------------------------------------------------------
if ! command -v "$PYTHON" >/dev/null 2>&1; then
    echo "[setup] error: $PYTHON not found; install Python >= 3.10" >&2
    exit 1
fi
if ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 10))'; then
    echo "[setup] error: $PYTHON is $("$PYTHON" --version 2>&1); farm needs Python >= 3.10" >&2
    exit 1
fi

if [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -m pip --version >/dev/null 2>&1; then
    say "virtual environment exists: $VENV"
else
    if [ -e "$VENV" ]; then
        say "virtual environment at $VENV is broken (no working pip): recreating it"
        rm -rf "$VENV"
    fi
    say "+ $PYTHON -m venv .venv   ($("$PYTHON" --version 2>&1))"
    "$PYTHON" -m venv "$VENV"
fi

# --- farm and its dependencies ---------------------------------------------------------------------------------
STAMP="$VENV/.farm-install-stamp"
want="$(sha256sum pyproject.toml | cut -d' ' -f1)"
have="$(cat "$STAMP" 2>/dev/null || true)"
if [ "$want" = "$have" ] && [ "${FARM_FORCE_INSTALL:-0}" != "1" ]; then
    say "farm already installed in .venv (pyproject.toml unchanged; FARM_FORCE_INSTALL=1 to reinstall)"
else
    say "+ .venv/bin/python -m pip install --upgrade pip"
    "$VENV/bin/python" -m pip install --disable-pip-version-check --upgrade pip
    say "+ .venv/bin/python -m pip install -e '.[all,test]'"
    "$VENV/bin/python" -m pip install --disable-pip-version-check -e '.[all,test]'
    echo "$want" > "$STAMP"
fi

say "done: activate with 'source .venv/bin/activate', or call .venv/bin/farm and .venv/bin/python directly"
