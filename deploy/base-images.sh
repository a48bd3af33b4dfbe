#!/usr/bin/env bash
# Local stand-ins for the three public base images, built from Debian's packages,
# for a machine that cannot reach a container registry (CI here, an air-gapped
# site with a Debian mirror):
#
#   eval "$(bash deploy/base-images.sh)"      # prints PYTHON_IMAGE=... POSTGRES_IMAGE=... NGINX_IMAGE=...
#   bash deploy/base-images.sh --local        # the local ones even if the public ones could be pulled
#
# The public images (python:3.11-slim, postgres:16, nginx:1.27-alpine) when they
# are present or can be pulled; else:
#   docker-compose up -d                      # Dockerfile and compose read those three variables
#
# python: debootstrap bookworm (minbase) with python3 3.11, venv and pip, imported
# with `docker import`; postgres and nginx: Debian's postgresql-15 and nginx FROM
# it, with an entrypoint that reads the official images' POSTGRES_* variables.
# A site with its own registry mirror needs none of this: set the three variables
# to the mirror's images (the defaults are the public ones).
#
# Cached: the debootstrap rootfs tarball under $CACHE, keyed by this script's and
# deploy/base-images/'s hash (a change to either rebuilds it), and the images
# themselves (labelled with the same key; an image with the current key is kept).
# Everything but the image names goes to stderr.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
CACHE="${LLMGW_BASE_IMAGE_CACHE:-/var/cache/llmgw-base-images}"
DOCKER="${DOCKER:-docker}"
MIRROR="${DEBIAN_MIRROR:-}"
if [ -z "$MIRROR" ]; then
  # The mirror this machine's apt already uses (deb822 sources or sources.list).
  MIRROR=$(grep -rhoE '^(URIs:|deb) +https?://[^ ]+/debian/?( |$)' /etc/apt/sources.list /etc/apt/sources.list.d/ 2>/dev/null \
    | grep -oE 'https?://[^ ]+' | head -n1 || true)
  MIRROR="${MIRROR:-http://deb.debian.org/debian}"
fi
PUBLIC=(python:3.11-slim postgres:16 nginx:1.27-alpine)
if [ "${1:-}" != "--local" ]; then
  # The public images when this machine has them or can pull them.
  have=0
  for image in "${PUBLIC[@]}"; do
    if "$DOCKER" image inspect "$image" >/dev/null 2>&1 || timeout 120 "$DOCKER" pull -q "$image" >/dev/null 2>&1; then
      have=$((have + 1))
    fi
  done
  if [ "$have" = 3 ]; then
    echo "PYTHON_IMAGE=${PUBLIC[0]}"; echo "POSTGRES_IMAGE=${PUBLIC[1]}"; echo "NGINX_IMAGE=${PUBLIC[2]}"
    echo "POSTGRES_IMAGE_USER=root"
    exit 0
  fi
  echo "base-images: the public images cannot be pulled; building local ones from Debian's packages" >&2
fi
key=$(cat "$0" "$here"/base-images/* | sha256sum | cut -c1-16)
PYTHON_IMAGE="llmgw-base/python:3.11-bookworm"
POSTGRES_IMAGE="llmgw-base/postgres:15-bookworm"
NGINX_IMAGE="llmgw-base/nginx:bookworm"

current() {  # the image exists and was built from this version of the script
  [ "$("$DOCKER" image inspect -f '{{index .Config.Labels "llmgw.base-key"}}' "$1" 2>/dev/null)" = "$key" ]
}

if ! current "$PYTHON_IMAGE"; then
  rootfs_tar="$CACHE/bookworm-python-$key.tar"
  if [ ! -s "$rootfs_tar" ]; then
    command -v debootstrap >/dev/null || { echo "base-images: debootstrap is not installed (apt-get install debootstrap)" >&2; exit 1; }
    mkdir -p "$CACHE"
    rootfs=$(mktemp -d /tmp/llmgw-rootfs.XXXXXX)
    trap 'rm -rf "$rootfs"' EXIT
    echo "base-images: debootstrap bookworm from $MIRROR (about a minute)" >&2
    debootstrap --variant=minbase --include=python3,python3-venv,python3-pip,ca-certificates,passwd \
      bookworm "$rootfs" "$MIRROR" >"$CACHE/debootstrap.log" 2>&1 \
      || { tail -n 30 "$CACHE/debootstrap.log" >&2; exit 1; }
    # This machine's CA bundle: pip and npm inside builds go through its TLS
    # setup. Kept as a local certificate too, so update-ca-certificates keeps it.
    if [ -s /etc/ssl/certs/ca-certificates.crt ]; then
      cp /etc/ssl/certs/ca-certificates.crt "$rootfs/etc/ssl/certs/ca-certificates.crt"
      cp /etc/ssl/certs/ca-certificates.crt "$rootfs/usr/local/share/ca-certificates/host-bundle.crt"
    fi
    ln -sf /usr/bin/python3 "$rootfs/usr/local/bin/python"
    rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
    tar -C "$rootfs" -cf "$rootfs_tar.tmp" . && mv "$rootfs_tar.tmp" "$rootfs_tar"
    rm -rf "$rootfs"; trap - EXIT
  fi
  echo "base-images: importing $PYTHON_IMAGE" >&2
  "$DOCKER" import \
    -c "LABEL llmgw.base-key=$key" \
    -c 'ENV LANG=C.UTF-8 PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    -c 'CMD ["python3"]' \
    "$rootfs_tar" "$PYTHON_IMAGE" >&2
fi

for pair in "postgres:$POSTGRES_IMAGE" "nginx:$NGINX_IMAGE"; do
  name=${pair%%:*}; image=${pair#*:}
  current "$image" && continue
  echo "base-images: building $image" >&2
  "$DOCKER" build --network host -q --label "llmgw.base-key=$key" \
    --build-arg "BASE=$PYTHON_IMAGE" -f "$here/base-images/$name.Dockerfile" -t "$image" \
    "$here/base-images" >&2
done

echo "PYTHON_IMAGE=$PYTHON_IMAGE"
echo "POSTGRES_IMAGE=$POSTGRES_IMAGE"
echo "NGINX_IMAGE=$NGINX_IMAGE"
# The user the postgres image runs as (docker-compose.yml builds pgBackRest into it).
echo "POSTGRES_IMAGE_USER=postgres"
