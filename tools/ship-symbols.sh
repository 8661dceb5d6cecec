#!/usr/bin/env bash
# The shipped layout of a release binary: the binary without its debug sections, and
# BINARY.gsym beside it, the symbol file that hang reports' stacks are resolved from
# (docs/diagnostics.md, "Symbols"). The Dockerfile and tests/release_binary.rs use it;
# an operator that embeds the library can too.
#
#   bash tools/ship-symbols.sh target/release/my-operator OUT_DIR
#
# Needs llvm-gsymutil and llvm-objcopy (Debian: `apt-get install llvm`, which puts them
# in /usr/lib/llvm-N/bin).
set -euo pipefail
binary=$1 out=$2
tool() {
    command -v "$1" 2>/dev/null && return
    # Debian's llvm package puts only some tools on PATH; all are in its own folder.
    find /usr/lib -maxdepth 3 -path '/usr/lib/llvm-*/bin/*' -name "$1" 2>/dev/null | sort -V | tail -n 1
}
gsymutil=$(tool llvm-gsymutil)
objcopy=$(tool llvm-objcopy)
if [[ -z $gsymutil || -z $objcopy ]]; then
    echo "ship-symbols: llvm-gsymutil and llvm-objcopy are needed (apt-get install llvm)" >&2
    exit 1
fi
name=$(basename "$binary")
mkdir -p "$out"
# The symbol file: one entry per function, its line table and inline tree, read where
# it lies (mapped) at run time. The converter's warnings about odd DWARF are noise.
"$gsymutil" --convert "$binary" --out-file "$out/$name.gsym" >/dev/null
# The symbol table stays: it names functions (with module paths) even without the
# symbol file, and the build id lets anyone match the binary with its symbol file.
"$objcopy" --strip-debug "$binary" "$out/$name"
