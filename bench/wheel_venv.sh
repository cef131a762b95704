# Sourced by wheel_check.sh and compat_check.sh (from the repository root, with PY set):
# `wheel_venv DIR` empties DIR, builds the wheel there from a copy of the files git sees (a
# build/ folder left in the tree would put stale modules in the wheel, and building leaves one)
# and creates DIR/venv. WORK, a temporary folder removed on exit, is left for the caller.
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

wheel_venv() {
    local dir=$1
    rm -rf "${dir:?}"/*
    mkdir "$WORK/src"
    git ls-files -z --cached --others --exclude-standard | xargs -0 sh -c 'for f; do [ -e "$f" ] && echo "$f"; done' sh \
        | tar -cf - -T - | tar -xf - -C "$WORK/src"
    "$PY" -m pip wheel -q --no-deps -w "$dir" "$WORK/src"
    "$PY" -m venv "$dir/venv"
}
