# Helpers of scripts/bench/run.sh, in a file of their own so that the
# untimed steps the timer runs (remounts before cold runs) can use them.
# Needs bin, dir, mnt and ratarmount in the environment.

# need_ratarmount [MODULE]: ratarmount from PyPI into $venv when missing,
# and the Python package MODULE with it (s3fs: fsspec's S3) when asked.
need_ratarmount() {
  [ -x "$venv/bin/ratarmount" ] || { log "installing ratarmount into $venv"; python3 -m venv "$venv" && "$venv/bin/pip" install -q ratarmount; }
  [ $# = 0 ] || "$venv/bin/python3" -c "import $1" 2>/dev/null || { log "installing $1 into $venv"; "$venv/bin/pip" install -q "$1"; }
}
drop_caches() { sync; echo 3 >/proc/sys/vm/drop_caches; }
unmount() { "$bin" umount "$1" >/dev/null 2>&1 || fusermount3 -u "$1" 2>/dev/null || fusermount -u "$1" 2>/dev/null || umount -l "$1" 2>/dev/null || true; }
# mount_as TOOL NAME: mounts corpus NAME with TOOL at $mnt/TOOL, prints the root to use.
mount_as() {
  local t=$1 n=$2 m=$mnt/$1
  mkdir -p "$m"
  case $t in
    native) echo "$dir/$n.native"; return ;;
    sessionfs) rm -rf "$dir/upper-$n"; "$bin" mount "$dir/$n.packet" "$m" --upper "$dir/upper-$n" --part workspace >"$dir/mount-$n.json" ;;
    squashfuse_ll) squashfuse_ll "$dir/$n.sqfs" "$m" ;;
    fuse-overlayfs) rm -rf "$dir/ovl-$n"; mkdir -p "$dir/ovl-$n/u" "$dir/ovl-$n/w"
      fuse-overlayfs -o "lowerdir=$dir/$n.native,upperdir=$dir/ovl-$n/u,workdir=$dir/ovl-$n/w" "$m" ;;
    ratarmount) "$ratarmount" "$dir/$n.tar" "$m" >/dev/null 2>&1 ;;
    archivemount) archivemount -o ro "$dir/$n.tar" "$m" ;;
  esac
  echo "$m"
}
unmount_as() { [ "$1" = native ] || unmount "$mnt/$1"; }
daemon_pid() { # TOOL NAME
  case $1 in
    sessionfs) json_field pid <"$dir/mount-$2.json" ;;
    *) pgrep -n -f "$1 .*/$2\.(sqfs|tar|native)" ;;
  esac
}
peak_rss_mib() { awk '/VmHWM/ {printf "%.1f", $2 / 1024}' "/proc/$1/status"; }

# json_field KEY: the value of KEY in the JSON object on stdin.
json_field() { python3 -c 'import json,sys; print(json.load(sys.stdin)[sys.argv[1]])' "$1"; }
# seconds_since START: seconds elapsed since START (a `date +%s.%N`).
seconds_since() { echo "$(date +%s.%N) - $1" | bc; }
