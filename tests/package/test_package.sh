#!/usr/bin/env bash
# The C++ package as users meet it:
#   install: cmake --install BUILD --prefix P; a project outside the tree with
#            find_package(seqpar REQUIRED) builds and runs; pkg-config finds seqpar.pc;
#   subdirectory: the same project with add_subdirectory(seqpar source) builds only the library.
# The consumer's program is the C++ block of the README's "Use it from C++".
# usage: test_package.sh install|subdirectory SOURCE_DIR BUILD_DIR
set -euo pipefail
mode=$1 src=$2 build=$3
[ -d "$build" ] || { echo "test_package.sh: no build folder '$build'" >&2; exit 2; }
# A fixed folder inside the build tree (not mktemp): below the checkout, ccache's base directory
# makes the consumer's compile lines the same in every checkout, so unchanged files are lookups.
tmp=$build/package-$mode
rm -rf "$tmp"
mkdir -p "$tmp"
trap 'rm -rf "$tmp"' EXIT
consumer=$tmp/consumer
cp -r "$src/tests/package/consumer" "$consumer"
awk '/^## Use it from C\+\+/{s=1} s && /^```cpp/{f=1; next} f && /^```/{exit} f' \
  "$src/README.md" >"$consumer/ring_example.cc"
[ -s "$consumer/ring_example.cc" ] || { echo "no C++ example in README.md" >&2; exit 1; }
launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
case $mode in
  install)
    cmake --install "$build" --prefix "$tmp/prefix" >/dev/null
    cmake -S "$consumer" -B "$tmp/b" -DCMAKE_PREFIX_PATH="$tmp/prefix" "${launcher[@]}" >/dev/null
    cmake --build "$tmp/b" -j2 >/dev/null
    "$tmp/b/ring_example"
    # The exported target carries none of the private dependencies.
    if grep -q -i "dnnl\|MPI::\|OpenMP" "$tmp"/prefix/lib*/cmake/seqpar/seqparTargets*.cmake; then
      echo "seqparTargets.cmake names a private dependency" >&2; exit 1
    fi
    pc=$(ls "$tmp"/prefix/lib*/pkgconfig/seqpar.pc)
    flags=$(PKG_CONFIG_PATH=$(dirname "$pc") pkg-config --cflags --libs seqpar)
    # shellcheck disable=SC2086
    c++ -std=c++20 "$consumer/ring_example.cc" -o "$tmp/pc_example" $flags \
      -Wl,-rpath,"$(PKG_CONFIG_PATH=$(dirname "$pc") pkg-config --variable=libdir seqpar)"
    "$tmp/pc_example"
    ;;
  subdirectory)
    cmake -S "$consumer" -B "$tmp/b" -DSEQPAR_SOURCE_DIR="$src" -DCMAKE_BUILD_TYPE=Release \
      "${launcher[@]}" >/dev/null
    cmake --build "$tmp/b" -j2 >/dev/null
    "$tmp/b/ring_example"
    ;;
  *) echo "usage: test_package.sh install|subdirectory SOURCE_DIR BUILD_DIR" >&2; exit 2 ;;
esac
