#!/usr/bin/env bash
# Make .carry/nsys/nsys-min.tar.xz: a real Nsight Systems for the GPU machine, which has
# none (its only nsys, inside Nsight Compute, cannot make a report). Issue 23.
#
#   bash tests/gpu/make_nsys_carry.sh        # needs apt (Debian's archive) and ~1 GB of /tmp
#
# Source: Debian's non-free nsight-systems-target and nsight-systems 2023.4.4 (trixie),
# fetched with a private sources list (nothing is installed here). Kept: the CLI and its
# target side (target-linux-x64, minus CUPTI for CUDA 10/11, MPI/UCX/SHMEM/cuDNN
# injections, the network collector and the Vulkan layers), and of the host side only
# what turns a capture into a report: QdstrmImporter, libexporter.so, the libraries they
# load from their own folder, the stats scripts (reports/, rules/, python/, sqlite3).
# QdstrmImporter's RPATH is $ORIGIN, so the system libraries it needs beyond glibc
# (libpfm, Kerberos, libcrypto, zlib: the package's Depends) are copied beside it.
# The result unpacks to nsight-systems/{bin,host-linux-x64,target-linux-x64}; the GPU
# check puts it at /opt/nvidia/nsight-systems/2023.4.4, where the agent looks.
set -euo pipefail
cd "$(dirname "$0")/../.."
W=$(mktemp -d); trap 'rm -rf "$W"' EXIT
mkdir -p "$W/lists/partial" "$W/debs" "$W/x"
echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian trixie non-free main" > "$W/sources.list"
A=(-o "Dir::Etc::SourceList=$W/sources.list" -o Dir::Etc::SourceParts=/dev/null -o "Dir::State::Lists=$W/lists")
apt-get "${A[@]}" update -qq
(cd "$W/debs" && apt-get "${A[@]}" download nsight-systems-target nsight-systems libpfm4 libssh-4 2>/dev/null)
for d in "$W"/debs/*.deb; do dpkg-deb -x "$d" "$W/x"; done
S=$W/x/usr/lib/nsight-systems; T=$W/x/usr/lib/x86_64-linux-gnu/nsight-systems/target-linux-x64
M=$W/min/nsight-systems; mkdir -p "$M/bin" "$M/host-linux-x64/Plugins"
cp -a "$T" "$M/target-linux-x64"
(cd "$M/target-linux-x64" && rm -rf libcupti.so.10.* libcupti.so.11.* CollectX libnvperf_grfx_host.so \
  vulkan-layers libToolsInjectionCuDNN* libToolsInjectionCuBLAS64_10.so libToolsInjection*MPI* \
  libToolsInjectionOpenSHMEM64.so libToolsInjectionUCP64.so)
ln -s ../target-linux-x64/nsys "$M/bin/nsys"
H=$S/host-linux-x64
# Debian links the host side's libssh.so to its own libssh-4: take that library in its place.
cp -L "$W"/x/usr/lib/x86_64-linux-gnu/libssh.so.4 "$H/libssh.so.deb"
rm -f "$H/libssh.so" && mv "$H/libssh.so.deb" "$H/libssh.so"
for f in QdstrmImporter libexporter.so $(cd "$H" && LD_LIBRARY_PATH=$PWD ldd QdstrmImporter libexporter.so \
    | awk '/host-linux-x64/ {print $3}' | xargs -n1 basename | sort -u); do
  cp -L "$H/$f" "$M/host-linux-x64/"
done
cp -a "$H/reports" "$H/rules" "$H/python" "$H/sqlite3" "$H/nvlog.config.template" "$M/host-linux-x64/"
cp -a "$H/Plugins/QuadDPlugin" "$M/host-linux-x64/Plugins/"
# Debian moves the stats reports' own modules to python3's dist-packages; the reports
# find them beside kernel_helper.py, where NVIDIA's own packages keep them.
cp "$W"/x/usr/lib/python3/dist-packages/nsysstats.py "$W"/x/usr/lib/python3/dist-packages/gpustats.py \
  "$M/host-linux-x64/python/lib/"
# System libraries beyond glibc's own, from Debian's libpfm4 and this machine (what
# libssh and the importer load: Kerberos, libcrypto, zlib).
cp -L "$W"/x/usr/lib/x86_64-linux-gnu/libpfm.so.4* "$M/host-linux-x64/" 2>/dev/null || true
LD_LIBRARY_PATH=$M/host-linux-x64 ldd "$M/host-linux-x64/QdstrmImporter" "$M/host-linux-x64/libexporter.so" \
  "$M/host-linux-x64/libssh.so" \
  | awk '$2 == "=>" && $3 ~ /^\// && $3 !~ /host-linux-x64/ {print $3}' | sort -u | while read -r lib; do
  case "$(basename "$lib")" in
    libc.so.*|ld-linux*|libm.so.*|libdl.so.*|libpthread.so.*|librt.so.*|libutil.so.*|libresolv.so.*|\
    libstdc++.so.*|libgcc_s.so.*) continue ;;
    libssh.so*) continue ;;
  esac
  cp -L "$lib" "$M/host-linux-x64/"
done
mkdir -p .carry/nsys
tar -C "$W/min" -cf - nsight-systems | xz -T2 -6 > .carry/nsys/nsys-min.tar.xz
echo "make_nsys_carry: $(du -h .carry/nsys/nsys-min.tar.xz | cut -f1)," \
  "$(ls "$M/host-linux-x64" | wc -l) host files, $(ls "$M/target-linux-x64" | wc -l) target files"
