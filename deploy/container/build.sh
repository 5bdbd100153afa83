#!/usr/bin/env bash
# Build the gateway's container image with buildah (Debian: apt-get install buildah mmdebstrap).
#
#   bash deploy/container/build.sh        IMAGE (default localhost/vsphere-mcp-gateway:dev)
#
# The package and every dependency are built as wheels here first (pip, with this machine's index
# settings), so the image build itself reaches no package index. BASE names an image with python3 and
# its venv module; unset, it is made here from Debian packages (mmdebstrap bookworm, python3 and
# python3-venv) and kept as localhost/gateway-base:bookworm, for machines that reach no container
# registry. BUILDAH_ISOLATION (default chroot: works without cgroup controllers or user namespaces)
# and STORAGE_DRIVER (default vfs: works without overlay) suit a container or CI machine; a
# workstation can use oci and overlay.
set -euo pipefail
cd "$(dirname "$0")/../.."
IMAGE="${1:-localhost/vsphere-mcp-gateway:dev}"
PYTHON="${PYTHON:-python3}"
buildah=(buildah --storage-driver "${STORAGE_DRIVER:-vfs}")
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

"$PYTHON" -m pip wheel --quiet --wheel-dir "$work/wheels" .
if [ -z "${BASE:-}" ]; then
    BASE=localhost/gateway-base:bookworm
    if ! "${buildah[@]}" inspect --type image "$BASE" >/dev/null 2>&1; then
        mmdebstrap --quiet --variant=minbase --include=python3,python3-venv,ca-certificates,passwd \
            bookworm "$work/rootfs.tar"
        container="$("${buildah[@]}" from scratch)"
        "${buildah[@]}" add "$container" "$work/rootfs.tar" / >/dev/null
        rm -f "$work/rootfs.tar"
        "${buildah[@]}" commit --quiet --rm "$container" "$BASE" >/dev/null
    fi
fi
"${buildah[@]}" bud --quiet --isolation "${BUILDAH_ISOLATION:-chroot}" --build-arg "BASE=$BASE" \
    -f deploy/container/Containerfile -t "$IMAGE" "$work"
echo "built $IMAGE"
