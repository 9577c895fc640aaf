#!/usr/bin/env bash
# Builds deploy/Containerfile with no registry, as CI does (docs/deploy.md "The image"):
#   1. two Debian bookworm minbase root filesystems made by mmdebstrap: the image's base
#      (python3, tini, CA certificates) and the build stage's (python3-venv, python3-dev, gcc);
#   2. both imported with `podman import` as local images (FROM never pulls);
#   3. the machine's own kubectl and gke-gcloud-auth-plugin in the build context `kubectl`
#      (KUBECTL_SOURCE=context; --kubectl apt takes Google Cloud's apt repository instead);
#   4. `buildah bud --isolation chroot --runtime runc` (pip reaches PyPI through the host's network).
# Everything goes to a scratch folder: the root filesystems, the kubectl binaries and a containers
# storage of its own (driver vfs, ~2 GB), removed at the end unless --keep.
#
#   deploy/build-image.sh [--tag TAG] [--scratch DIR] [--keep] [--save FILE] [--kubectl context|apt]
#   deploy/build-image.sh --remove DIR   # a scratch folder kept with --keep, storage and all
#
#   --tag TAG        the image's name (default localhost/steptail:dev)
#   --scratch DIR    the scratch folder, new or empty (default: a new one under $TMPDIR)
#   --keep           leave the scratch folder and its storage (with the image) in place; use it with
#                    CONTAINERS_STORAGE_CONF=DIR/storage.conf CONTAINERS_CONF=DIR/containers.conf,
#                    then remove it with --remove DIR
#   --save FILE      also write the image to FILE (`podman save`, OCI archive; `podman load -i FILE`)
#   --kubectl SRC    context (default): the machine's kubectl, found behind gcloud's dispatcher;
#                    apt: Google Cloud's apt repository. $KUBECTL and $GKE_GCLOUD_AUTH_PLUGIN
#                    name the binaries to copy instead of the ones on PATH.
# Needs root, mmdebstrap, podman, buildah and runc (Debian packages of those names).
set -euo pipefail

tag=localhost/steptail:dev
scratch=""
keep=0
save=""
source=context
remove=""
while [ $# -gt 0 ]; do
  case "$1" in
    --remove) remove=$2; shift 2 ;;
    --tag) tag=$2; shift 2 ;;
    --scratch) scratch=$2; shift 2 ;;
    --keep) keep=1; shift ;;
    --save) save=$2; shift 2 ;;
    --kubectl) source=$2; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "build-image.sh: unknown argument $1 (--help)" >&2; exit 2 ;;
  esac
done
case "$source" in context|apt) ;; *) echo "build-image.sh: --kubectl context or apt" >&2; exit 2 ;; esac
[ "$(id -u)" = 0 ] || { echo "build-image.sh: needs root (mmdebstrap, podman import)" >&2; exit 2; }

# The scratch folder goes with its storage: no mount may stay under it (a build cut short), and
# rm stays on its filesystem. The image library keeps a blob cache in /var/lib/containers/cache
# for root, whatever the storage: removed too if this script made it (the marker file says so).
remove_scratch() {
  local dir=$1
  [ -f "$dir/storage.conf" ] || { echo "build-image.sh: $dir is no scratch folder of this script" >&2; return 1; }
  awk -v s="$dir/" 'index($5 "/", s) == 1 {print $5}' /proc/self/mountinfo | sort -r \
    | while read -r m; do umount -l "$m" || true; done
  if [ -e "$dir/made-var-lib-containers" ]; then rm -rf /var/lib/containers; fi
  rm -rf --one-file-system "$dir"
}
if [ -n "$remove" ]; then
  remove_scratch "$(cd "$remove" && pwd)"
  exit
fi

for tool in mmdebstrap podman buildah runc; do
  command -v "$tool" >/dev/null || { echo "build-image.sh: $tool is missing (apt-get install $tool)" >&2; exit 2; }
done

root=$(cd "$(dirname "$0")/.." && pwd)
if [ -n "$save" ]; then
  case "$save" in /*) ;; *) save=$PWD/$save ;; esac
  mkdir -p "$(dirname "$save")"
fi
if [ -z "$scratch" ]; then
  scratch=$(mktemp -d "${TMPDIR:-/tmp}/steptail-image.XXXXXX")
else  # removed at the end: a new or empty folder only
  mkdir -p "$scratch"
  scratch=$(cd "$scratch" && pwd)
  [ -z "$(ls -A "$scratch")" ] || { echo "build-image.sh: --scratch $scratch is not empty" >&2; exit 2; }
fi
[ -e /var/lib/containers ] || touch "$scratch/made-var-lib-containers"

cleanup() {
  local rc=$?
  if [ "$keep" = 0 ]; then remove_scratch "$scratch"; fi
  exit "$rc"
}
trap cleanup EXIT

# A containers storage and engine configuration of our own: vfs (no overlay mounts), runc
# (crun fails on hybrid cgroups), no events journal, temporary files in the scratch folder.
cat > "$scratch/storage.conf" <<EOF
[storage]
driver = "vfs"
graphroot = "$scratch/storage/graph"
runroot = "$scratch/storage/run"
EOF
cat > "$scratch/containers.conf" <<EOF
[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "none"
tmp_dir = "$scratch/storage/libpod"
EOF
export CONTAINERS_STORAGE_CONF=$scratch/storage.conf CONTAINERS_CONF=$scratch/containers.conf
export TMPDIR=$scratch/tmp
mkdir -p "$TMPDIR"

step() { printf 'build-image: %s\n' "$*" >&2; }
timed() {  # timed NAME COMMAND...: runs it, then "build-image: NAME took S s" (benchmarks/image.py reads it)
  local name=$1 start=$EPOCHREALTIME
  shift
  "$@"
  step "$name took $(awk -v a="$start" -v b="$EPOCHREALTIME" 'BEGIN {printf "%.1f", b - a}') s"
}

# --- 1. the base root filesystems (docs and man pages left out; copyright files kept)
slim=(--dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/doc/*'
      --dpkgopt='path-include=/usr/share/doc/*/copyright' --dpkgopt='path-exclude=/usr/share/info/*')
timed mmdebstrap-runtime mmdebstrap --quiet --variant=minbase "${slim[@]}" \
  --include=python3,ca-certificates,tini bookworm "$scratch/runtime.tar"
# The machine's own CAs (/usr/local/share/ca-certificates: a TLS-inspecting egress proxy, say) in
# the build stage's base only, so its pip reaches PyPI as the machine's does; never in the image.
local_cas=()
if compgen -G '/usr/local/share/ca-certificates/*.crt' >/dev/null; then
  local_cas=(--customize-hook='sync-in /usr/local/share/ca-certificates /usr/local/share/ca-certificates'
             --customize-hook='chroot "$1" update-ca-certificates >/dev/null 2>&1')
fi
timed mmdebstrap-build mmdebstrap --quiet --variant=minbase "${slim[@]}" "${local_cas[@]}" \
  --include=python3,python3-venv,python3-dev,gcc,libc6-dev,ca-certificates bookworm "$scratch/build.tar"

# --- 2. imported as local images; a rootfs tarball has no environment, so PATH is set here
base=localhost/steptail-base:bookworm
build_base=localhost/steptail-build-base:bookworm
path_env='ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin'
import_image() { podman import --quiet --change "$path_env" "$1" "$2" >/dev/null; }
timed import-runtime import_image "$scratch/runtime.tar" "$base"
timed import-build import_image "$scratch/build.tar" "$build_base"
rm -f "$scratch/runtime.tar" "$scratch/build.tar"

# --- 3. the machine's kubectl: gcloud's /usr/bin/kubectl is a dispatcher (vX.Y.Z-dispatcher)
# that runs kubectl.X.Y beside it; the image needs that real binary, which runs alone.
context_args=()
if [ "$source" = context ]; then
  kubectl=${KUBECTL:-$(readlink -f "$(command -v kubectl)")}
  version=$("$kubectl" version --client -o json | sed -n 's/.*"gitVersion": *"\(v[^"]*\)".*/\1/p')
  case "$version" in
    *-dispatcher)
      minor=$(printf '%s' "$version" | sed 's/^v\([0-9]*\.[0-9]*\).*/\1/')
      kubectl=$(dirname "$kubectl")/kubectl.$minor
      [ -x "$kubectl" ] || { echo "build-image.sh: $version runs $kubectl, which is missing" >&2; exit 1; }
      ;;
  esac
  plugin=${GKE_GCLOUD_AUTH_PLUGIN:-$(readlink -f "$(command -v gke-gcloud-auth-plugin)")}
  mkdir -p "$scratch/kubectl"
  install -m 0755 "$kubectl" "$scratch/kubectl/kubectl"
  install -m 0755 "$plugin" "$scratch/kubectl/gke-gcloud-auth-plugin"
  step "kubectl $("$kubectl" version --client -o json | sed -n 's/.*"gitVersion": *"\([^"]*\)".*/\1/p') from $kubectl, gke-gcloud-auth-plugin from $plugin"
  context_args=(--build-context "kubectl=$scratch/kubectl")
fi

# --- 4. the image (KUBECTL_SOURCE always given: buildah < 1.29 ignores an ARG's default in FROM)
timed build buildah bud --isolation chroot --runtime runc \
  --build-arg "PYTHON_IMAGE=$base" --build-arg "BUILD_IMAGE=$build_base" \
  --build-arg "KUBECTL_SOURCE=$source" "${context_args[@]}" \
  -f "$root/deploy/Containerfile" -t "$tag" "$root"

size=$(podman image inspect --format '{{.Size}}' "$tag")
step "built $tag: $((size / 1000000)) MB"
if [ -n "$save" ]; then
  rm -f "$save"
  timed save podman save --quiet --format oci-archive -o "$save" "$tag"
  step "saved $tag to $save ($(($(stat -c %s "$save") / 1000000)) MB; podman load -i $save)"
fi
if [ "$keep" = 1 ]; then
  step "kept $scratch: CONTAINERS_STORAGE_CONF=$scratch/storage.conf CONTAINERS_CONF=$scratch/containers.conf podman run ... $tag"
fi
