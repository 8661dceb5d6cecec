#!/usr/bin/env bash
# The shipped layout of a release binary: the binary without its debug sections, and
# BINARY.gsym beside it, the symbol file that hang reports' stacks are resolved from
# (docs/diagnostics.md, "Symbols"). The Dockerfile and tests/release_binary.rs use it;
# an operator that embeds the library can too.
#
#   bash tools/ship-symbols.sh target/release/my-operator OUT_DIR
#
# Needs llvm-gsymutil and llvm-objcopy: from LLVM_BIN if set, else from the newest
# /usr/lib/llvm-N/bin (Debian: `apt-get install llvm`; the image uses LLVM 19), else
# from PATH.
set -euo pipefail
if [[ $# -ne 2 || ! -f $1 ]]; then
    echo "usage: bash tools/ship-symbols.sh BINARY OUT_DIR (BINARY: a release build with line tables)" >&2
    exit 2
fi
binary=$1 out=$2
tool() {
    if [[ -n ${LLVM_BIN:-} ]]; then
        [[ -x $LLVM_BIN/$1 ]] && echo "$LLVM_BIN/$1"
        return
    fi
    # Debian's llvm package puts only some tools on PATH, and an older LLVM's may be
    # there; every version's are in its own folder.
    local newest
    newest=$(find /usr/lib -maxdepth 3 -path '/usr/lib/llvm-*/bin/*' -name "$1" 2>/dev/null | sort -V | tail -n 1)
    if [[ -n $newest ]]; then echo "$newest"; else command -v "$1" 2>/dev/null || true; fi
}
gsymutil=$(tool llvm-gsymutil)
objcopy=$(tool llvm-objcopy)
if [[ -z $gsymutil || -z $objcopy ]]; then
    echo "ship-symbols: llvm-gsymutil and llvm-objcopy are needed (apt-get install llvm, or LLVM_BIN=DIR)" >&2
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
