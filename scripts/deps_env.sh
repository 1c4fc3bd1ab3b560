# deps_env.sh — sourced by scripts/gpu_test.sh and scripts/gpu_ab.sh from the tree's root: points pkg-config and the
# loader at .deps/cjson when scripts/fetch_cjson.sh unpacked it there (a machine without a package registry: the lent
# GPU machine), through a .pc file whose libdir and includedir point into the unpacked tree (a sysroot would also move
# every other package's paths); and puts the CUDA toolkit's usual bin folder on PATH.
if [ -d .deps/cjson ]; then
  root=$PWD/.deps/cjson
  mkdir -p .deps/pkgconfig
  sed -e "s|^libdir=/usr|libdir=$root/usr|" -e "s|^includedir=/usr|includedir=$root/usr|" \
    "$root/usr/lib/x86_64-linux-gnu/pkgconfig/libcjson.pc" >.deps/pkgconfig/libcjson.pc
  export PKG_CONFIG_PATH=$PWD/.deps/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}
  export LD_LIBRARY_PATH=$root/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
fi
export PATH=$PATH:/usr/local/cuda/bin
