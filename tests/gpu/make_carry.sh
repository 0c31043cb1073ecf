#!/usr/bin/env bash
# Fill .carry/sshd/ with this machine's OpenSSH server, for the GPU machine, which has none.
#
#   bash tests/gpu/make_carry.sh [DEST]        # DEST defaults to .carry/sshd (git-ignored)
#
# bin/: sshd, sftp-server, ssh-keygen, and the clients ssh and scp that the benches' by-hand
# path runs (copied, links resolved; run_gpu_check.sh puts wrappers that set LD_LIBRARY_PATH
# for them first on PATH). lib/: every shared library
# `ldd` lists for them except glibc's own (libc, the dynamic loader, libm, libresolv...):
# those belong to the host's loader and must be the host's. GLIBC names the newest glibc
# symbol version the carried files need (the host's glibc must be at least that);
# MANIFEST says where each file came from, with its sha256. tests/sshd.py runs this sshd
# when GPUWS_CARRIED_SSHD names the folder, with LD_LIBRARY_PATH=lib/ for sshd alone.
set -euo pipefail
cd "$(dirname "$0")/../.."
DEST=${1:-.carry/sshd}
LIMIT=$((20 * 1024 * 1024))
BINS=(/usr/sbin/sshd /usr/lib/openssh/sftp-server /usr/bin/ssh-keygen /usr/bin/ssh /usr/bin/scp)
for b in "${BINS[@]}"; do
  [ -x "$b" ] || { echo "make_carry: $b is missing (apt-get install openssh-server)" >&2; exit 1; }
done
if [ -e /usr/lib/openssh/sshd-session ]; then
  # OpenSSH 9.8+ splits the server in several programs; tests/sshd.py expects one sshd.
  echo "make_carry: this OpenSSH has sshd-session; carry it too before using this" >&2
  exit 1
fi
rm -rf "$DEST"
mkdir -p "$DEST/bin" "$DEST/lib"
cp -L "${BINS[@]}" "$DEST/bin/"
chmod 755 "$DEST"/bin/*
ldd "${BINS[@]}" | awk '$2 == "=>" && $3 ~ /^\// {print $3}' | sort -u | while read -r lib; do
  case "$(basename "$lib")" in
    libc.so.*|ld-linux*|libm.so.*|libmvec.so.*|libresolv.so.*|libdl.so.*|libpthread.so.*|\
    librt.so.*|libutil.so.*|libanl.so.*|libnss_*|libthread_db.so.*|libBrokenLocale.so.*)
      continue ;;
  esac
  cp -L "$lib" "$DEST/lib/"
done
chmod 644 "$DEST"/lib/*
# The newest GLIBC_x.y symbol version any carried file asks for.
{ objdump -T "$DEST"/bin/* "$DEST"/lib/* 2>/dev/null || readelf -V -W "$DEST"/bin/* "$DEST"/lib/*; } \
  | grep -o 'GLIBC_[0-9][0-9.]*' | sed 's/GLIBC_//' | sort -V | tail -1 > "$DEST/GLIBC"
{
  echo "made $(date -u +%FT%TZ) on $(. /etc/os-release && echo "$PRETTY_NAME"), glibc $(getconf GNU_LIBC_VERSION | cut -d' ' -f2)"
  echo "$(/usr/sbin/sshd -V 2>&1 | head -1)"
  echo "needs glibc >= $(cat "$DEST/GLIBC") on the host"
  for f in "$DEST"/bin/* "$DEST"/lib/*; do
    echo "$(sha256sum "$f" | cut -d' ' -f1)  $(basename "$f")"
  done
} > "$DEST/MANIFEST"
size=$(du -sb "$DEST" | cut -f1)
if [ "$size" -gt "$LIMIT" ]; then
  echo "make_carry: $DEST is $size bytes, over the 20 MiB carry budget" >&2
  exit 1
fi
echo "make_carry: $DEST: $(ls "$DEST/bin" | wc -l) programs, $(ls "$DEST/lib" | wc -l) libraries," \
  "$((size / 1024)) KiB, needs glibc >= $(cat "$DEST/GLIBC")"
