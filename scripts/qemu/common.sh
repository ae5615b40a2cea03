# Shared by the scripts in scripts/qemu/: where things are cached.
# shellcheck shell=bash

QEMU_SCRIPTS="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_ROOT="$(cd "$QEMU_SCRIPTS/../.." && pwd)"
# Everything downloaded or built for the guest lives here (gitignored `.build/`).
QEMU_CACHE="${TUTTI_QEMU_CACHE:-$REPO_ROOT/.build/qemu}"

die() {
    echo "qemu: $*" >&2
    exit 1
}
