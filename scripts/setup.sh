#!/usr/bin/env bash
# Build .venv with the validated stack (requirements/*.lock) and install the plugin
# with its native extension. Idempotent: a re-run installs only what is missing.
#
#   scripts/setup.sh          runtime stack + plugin
#   scripts/setup.sh --dev    + test and lint tools
#
# Variables: VENV (default .venv), PYTHON (default python3, 3.10-3.12),
#            VLLM_KUNLUN_BUILD_EXT=0 to skip the native extension.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${VENV:-.venv}
PYTHON=${PYTHON:-python3}
UV_VERSION=0.13.9
dev=0
for arg in "$@"; do
  case "$arg" in
    --dev) dev=1 ;;
    *) echo "setup.sh: unknown argument '$arg' (use --dev or nothing)" >&2; exit 2 ;;
  esac
done

pyver=$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
case "$pyver" in
  3.10|3.11|3.12) ;;
  *) echo "setup.sh: Python $pyver found; torch 2.5.1 + vllm 0.15.1 need 3.10-3.12. Set PYTHON=python3.11." >&2; exit 1 ;;
esac

start=$(date +%s)
if [ ! -x "$VENV/bin/python" ]; then
  echo "==> creating $VENV with $PYTHON ($pyver)"
  "$PYTHON" -m venv "$VENV"
fi
py="$VENV/bin/python"
if ! "$VENV/bin/uv" --version 2>/dev/null | grep -q "$UV_VERSION"; then
  echo "==> installing uv $UV_VERSION into $VENV"
  "$py" -m pip install -q --disable-pip-version-check "uv==$UV_VERSION"
fi
uv=("$VENV/bin/uv" pip install --python "$py")

echo "==> validated stack (requirements/stack.lock)"
"${uv[@]}" -r requirements/stack.lock
if [ "$dev" = 1 ]; then
  echo "==> test and lint tools (requirements/dev.lock)"
  "${uv[@]}" -r requirements/dev.lock
fi
# vllm's metadata pins torch 2.9.1 and transformers<5: install it without its deps.
echo "==> vllm (--no-deps, requirements/vllm.txt)"
"${uv[@]}" --no-deps -r requirements/vllm.txt
# --no-build-isolation: the extension builds against the venv's torch 2.5.1.
# The install is editable, so Python changes need no reinstall; rebuild only when the
# build inputs (or VLLM_KUNLUN_BUILD_EXT) changed since the last successful build.
stamp="$VENV/.vllm-kunlun-build"
inputs=$(cat setup.py pyproject.toml csrc/* vllm_kunlun/__init__.py | sha256sum | cut -c1-16)
want="$inputs ext=${VLLM_KUNLUN_BUILD_EXT:-1}"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && "$py" -c 'import vllm_kunlun' 2>/dev/null; then
  echo "==> vllm-kunlun: build inputs unchanged, editable install kept"
else
  echo "==> vllm-kunlun (editable, native extension unless VLLM_KUNLUN_BUILD_EXT=0)"
  rm -f "$stamp"
  "${uv[@]}" --no-deps --no-build-isolation --reinstall-package vllm-kunlun -e .
  echo "$want" > "$stamp"
fi

# Bytecode for every installed module, once per set of locks: uv does not write it,
# and where PYTHONDONTWRITEBYTECODE is set (CI images set it) no process caches what
# it compiles, so every interpreter (each engine, worker and test child) would compile
# torch, vLLM and transformers from source again.
bc_stamp="$VENV/.vllm-kunlun-bytecode"
bc_want="$(cat requirements/stack.lock requirements/dev.lock requirements/vllm.txt | sha256sum | cut -c1-16) dev=$dev"
if [ ! -f "$bc_stamp" ] || [ "$(cat "$bc_stamp")" != "$bc_want" ]; then
  echo "==> bytecode for site-packages (compileall)"
  site=$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  # Not fatal: a module without bytecode is compiled at import, only slower. With -q
  # compileall prints only the files it could not compile.
  "$py" -m compileall -q -j 0 "$site" ||
    echo "setup.sh: compileall could not compile the files above (imports still work)" >&2
  echo "$bc_want" > "$bc_stamp"
fi

echo "==> stack check"
"$VENV/bin/vllm-kunlun" versions --strict
echo "==> setup done in $(( $(date +%s) - start ))s; venv size $(du -sh "$VENV" | cut -f1)"
