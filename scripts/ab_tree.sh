# ab_tree.sh — sourced by scripts/gpu_ab.sh and scripts/pack_ab_bins.sh: the A side of an A/B measurement.
#   ab_reversed_tree PREFIX DEST PATCH [EXCLUDE]
# Copies the tree in the current folder (no build folders, .deps, .git, .venv, nor ./EXCLUDE) into the empty folder
# DEST and reverses PATCH there (`git apply -R`, which needs no repository); returns 1 with a message naming PREFIX
# when PATCH does not reverse cleanly or leaves DEST the same tree as the current one (an empty PATCH).
ab_reversed_tree() {
  local prefix=$1 dest=$2 patch=$3 copy_skip=() diff_skip=()
  [ -n "${4:-}" ] && { copy_skip=(--exclude="./$4"); diff_skip=(--exclude="$(basename "$4")"); }
  tar --exclude='./build*' --exclude=./.deps --exclude=./.git --exclude=./.venv "${copy_skip[@]}" -cf - . |
    tar -xf - -C "$dest"
  # GIT_CEILING_DIRECTORIES: were DEST inside some repository (TMPDIR in a work tree), `git apply` would take its
  # paths from that repository's top
  (cd "$dest" && GIT_CEILING_DIRECTORIES=$(dirname "$dest") git apply -R "$patch") ||
    { echo "$prefix: PATCH ($patch) does not reverse cleanly on this tree" >&2; return 1; }
  if diff -rq --exclude='build*' --exclude=.deps --exclude=.git --exclude=.venv "${diff_skip[@]}" . "$dest" >/dev/null; then
    echo "$prefix: A is the same tree as B (an empty PATCH?)" >&2
    return 1
  fi
}
