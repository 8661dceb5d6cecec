"""Lists the public API of the reconcile-watchdog library from rustdoc's JSON output.

Usage: public_api.py RUSTDOC_JSON > lib/public-api.txt (tests/library.sh runs it).

One line per public item, at the path a user names it by: modules, structs and their
public fields, enums and their variants, traits and their items, functions, methods,
consts, statics, type aliases, macros, the trait implementations a type declares (derived
ones included; auto traits and blanket implementations are the compiler's, left out) and
re-exports (an item reachable at a second path is listed once where it is defined, and
`pub use` at the other). Signatures are rendered from the JSON, so a changed parameter
type shows as well as a new `pub`.

Why rustdoc JSON: it is the compiler's own view of what is reachable (private modules,
`pub(crate)` and `#[doc(hidden)]` items are already stripped), the standard library of
python3 reads it, and no tool needs installing (cargo-public-api would, and grepping the
sources for `pub` cannot tell a re-exported item from one in a private module). The
format is unstable (RUSTC_BOOTSTRAP=1); a toolchain that changes it may need this file
updated, and the error names the format version it read.
"""

import json
import re
import sys

KNOWN_FORMAT_VERSIONS = {57}


def main():
    with open(sys.argv[1], encoding="utf-8") as file:
        doc = json.load(file)
    try:
        lines = Lister(doc).lines()
    except (KeyError, TypeError, ValueError) as error:
        raise SystemExit(
            f"public_api.py: rustdoc JSON format {doc.get('format_version')} not understood "
            f"(known: {sorted(KNOWN_FORMAT_VERSIONS)}): {error!r}"
        ) from error
    sys.stdout.write("".join(line + "\n" for line in lines))


SUBJECT = re.compile(r"\w+(?:::\w+)*")


def sort_key(line):
    """Each item under its parent, a type's trait implementations after its members."""
    if line.startswith("impl"):
        subject = line.split(" for ", 1)[1]
        return (SUBJECT.search(subject).group().split("::") + ["~impl"], line)
    keywords = {"pub", "use", "mod", "struct", "enum", "union", "unsafe", "trait", "fn", "const",
                "async", "static", "mut", "type", "macro"}
    words = [w for w in line.split(" ") if w not in keywords]
    return (SUBJECT.search(words[0]).group().split("::"), line)


class Lister:
    def __init__(self, doc):
        self.index = doc["index"]
        self.paths = doc["paths"]
        self.root = str(doc["root"])
        # Every public path of each local item: (path, defined there rather than re-exported).
        self.reachable = {}
        self.externals = []
        self.walk(self.root, [self.index[self.root]["name"]], False)
        self.public_path = {
            item: min(paths, key=lambda p: (not p[1], len(p[0]), p[0]))[0]
            for item, paths in self.reachable.items()
        }

    def walk(self, item_id, path, via_use):
        self.reachable.setdefault(item_id, []).append((tuple(path), not via_use))
        inner = self.index[item_id]["inner"]
        if "module" not in inner or len(self.reachable[item_id]) > 1:
            return
        for child in map(str, inner["module"]["items"]):
            item = self.index[child]
            if "use" in item["inner"]:
                use = item["inner"]["use"]
                if use["is_glob"]:
                    raise ValueError(f"glob re-export {use['source']}: list it by hand")
                target = str(use["id"]) if use["id"] is not None else None
                if target in self.index and self.index[target]["crate_id"] == 0:
                    self.walk(target, path + [use["name"]], True)
                else:
                    external = self.paths.get(target, {}).get("path") or [use["source"]]
                    self.externals.append(
                        f"pub use {'::'.join(path + [use['name']])} = {'::'.join(external)}"
                    )
            else:
                self.walk(child, path + [item["name"]], False)

    def lines(self):
        out = list(self.externals)
        for item_id, paths in self.reachable.items():
            public = self.public_path[item_id]
            for path, _ in paths:
                if path != public:
                    out.append(f"pub use {'::'.join(path)} = {'::'.join(public)}")
            out.extend(self.item(item_id, "::".join(public)))
        return sorted(set(out), key=sort_key)

    # Items.

    def item(self, item_id, path):
        item = self.index[item_id]
        kind, inner = next(iter(item["inner"].items()))
        if kind == "module":
            return [f"pub mod {path}"]
        if kind == "struct":
            return self.struct(path, inner)
        if kind == "enum":
            out = [f"pub enum {path}{self.generics(inner['generics'])}"]
            for variant in map(str, inner["variants"]):
                out.append(self.variant(f"{path}::{self.index[variant]['name']}", variant))
            return out + self.impls(path, inner["impls"])
        if kind == "union":
            return [f"pub union {path}{self.generics(inner['generics'])}"] + self.impls(
                path, inner["impls"]
            )
        if kind == "trait":
            return self.trait(path, inner)
        if kind == "function":
            return [self.function("pub ", path, inner)]
        if kind == "constant":
            return [f"pub const {path}: {self.ty(inner['type'])}"]
        if kind == "static":
            mutable = "mut " if inner["is_mutable"] else ""
            return [f"pub static {mutable}{path}: {self.ty(inner['type'])}"]
        if kind == "type_alias":
            generics = self.generics(inner["generics"])
            return [f"pub type {path}{generics} = {self.ty(inner['type'])}"]
        if kind in ("macro", "proc_macro"):
            return [f"pub macro {path}!"]
        raise ValueError(f"item kind {kind} of {path}")

    def struct(self, path, inner):
        generics = self.generics(inner["generics"])
        shape = inner["kind"]
        out = []
        if shape == "unit":
            out.append(f"pub struct {path}{generics}")
        elif "tuple" in shape:
            fields = ", ".join(
                "_" if field is None else self.field_type(str(field)) for field in shape["tuple"]
            )
            out.append(f"pub struct {path}{generics}({fields})")
        else:
            out.append(f"pub struct {path}{generics}")
            for field in map(str, shape["plain"]["fields"]):
                name = self.index[field]["name"]
                out.append(f"pub {path}::{name}: {self.field_type(field)}")
        return out + self.impls(path, inner["impls"])

    def field_type(self, field_id):
        return self.ty(self.index[field_id]["inner"]["struct_field"])

    def variant(self, path, variant_id):
        kind = self.index[variant_id]["inner"]["variant"]["kind"]
        if kind == "plain":
            return f"pub {path}"
        if "tuple" in kind:
            fields = ", ".join(
                "_" if field is None else self.field_type(str(field)) for field in kind["tuple"]
            )
            return f"pub {path}({fields})"
        fields = ", ".join(
            f"{self.index[str(field)]['name']}: {self.field_type(str(field))}"
            for field in kind["struct"]["fields"]
        )
        return f"pub {path} {{ {fields} }}"

    def trait(self, path, inner):
        bounds = self.bounds(inner["bounds"])
        unsafe = "unsafe " if inner["is_unsafe"] else ""
        out = [
            f"pub {unsafe}trait {path}{self.generics(inner['generics'])}"
            + (f": {bounds}" if bounds else "")
        ]
        for member in map(str, inner["items"]):
            out.append(self.associated("", f"{path}::{self.index[member]['name']}", member))
        return out

    def impls(self, path, impl_ids):
        out = []
        for impl_id in map(str, impl_ids):
            impl = self.index[impl_id]["inner"]["impl"]
            if impl["is_synthetic"] or impl["blanket_impl"] is not None:
                continue
            if impl["trait"] and impl["trait"]["path"] == "StructuralPartialEq":
                continue  # derive(PartialEq)'s marker for the compiler, not API of its own
            if impl["trait"] is None:
                for member in map(str, impl["items"]):
                    item = self.index[member]
                    if item["visibility"] == "public":
                        out.append(self.associated("pub ", f"{path}::{item['name']}", member))
            else:
                negative = "!" if impl["is_negative"] else ""
                generics = self.generics(impl["generics"], where=False)
                where = self.where_clause(impl["generics"])
                out.append(
                    f"impl{generics} {negative}{self.path(impl['trait'])} for "
                    f"{self.ty(impl['for'])}{where}"
                )
        return out

    def associated(self, visibility, path, member_id):
        kind, inner = next(iter(self.index[member_id]["inner"].items()))
        if kind == "function":
            return self.function(visibility, path, inner)
        if kind == "assoc_const":
            return f"{visibility}const {path}: {self.ty(inner['type'])}"
        if kind == "assoc_type":
            bounds = self.bounds(inner["bounds"])
            value = f" = {self.ty(inner['type'])}" if inner.get("type") else ""
            return f"{visibility}type {path}" + (f": {bounds}" if bounds else "") + value
        raise ValueError(f"associated item kind {kind} of {path}")

    def function(self, visibility, path, inner):
        header = inner["header"]
        qualifiers = "".join(
            word + " "
            for word, on in (
                ("const", header["is_const"]),
                ("async", header["is_async"]),
                ("unsafe", header["is_unsafe"]),
            )
            if on
        )
        sig = inner["sig"]
        params = ", ".join(self.param(name, ty) for name, ty in sig["inputs"])
        output = f" -> {self.ty(sig['output'])}" if sig["output"] is not None else ""
        generics = self.generics(inner["generics"], where=False)
        return f"{visibility}{qualifiers}fn {path}{generics}({params}){output}" + self.where_clause(
            inner["generics"]
        )

    def param(self, name, ty):
        if name == "self":
            if ty == {"generic": "Self"}:
                return "self"
            ref = ty.get("borrowed_ref")
            if ref and ref["type"] == {"generic": "Self"}:
                lifetime = f"{ref['lifetime']} " if ref["lifetime"] else ""
                return f"&{lifetime}{'mut ' if ref['is_mutable'] else ''}self"
            return f"self: {self.ty(ty)}"
        return f"{name}: {self.ty(ty)}"

    # Generics, bounds and types.

    def generics(self, generics, where=True):
        params = []
        for param in generics["params"]:
            kind, inner = next(iter(param["kind"].items()))
            if kind == "lifetime":
                outlives = " + ".join(inner["outlives"])
                params.append(param["name"] + (f": {outlives}" if outlives else ""))
            elif kind == "type":
                if inner["is_synthetic"]:
                    continue
                bounds = self.bounds(inner["bounds"])
                default = f" = {self.ty(inner['default'])}" if inner["default"] else ""
                params.append(param["name"] + (f": {bounds}" if bounds else "") + default)
            else:
                default = f" = {inner['default']}" if inner["default"] else ""
                params.append(f"const {param['name']}: {self.ty(inner['type'])}{default}")
        rendered = f"<{', '.join(params)}>" if params else ""
        return rendered + (self.where_clause(generics) if where else "")

    def where_clause(self, generics):
        predicates = []
        for predicate in generics["where_predicates"]:
            kind, inner = next(iter(predicate.items()))
            if kind == "bound_predicate":
                bounds = self.bounds(inner["bounds"])
                hrtb = self.for_lifetimes(inner["generic_params"])
                predicates.append(f"{hrtb}{self.ty(inner['type'])}: {bounds}")
            elif kind == "lifetime_predicate":
                predicates.append(f"{inner['lifetime']}: {' + '.join(inner['outlives'])}")
            else:
                predicates.append(f"{self.ty(inner['lhs'])} = {self.term(inner['rhs'])}")
        return f" where {', '.join(predicates)}" if predicates else ""

    def for_lifetimes(self, generic_params):
        names = [param["name"] for param in generic_params]
        return f"for<{', '.join(names)}> " if names else ""

    def bounds(self, bounds):
        out = []
        for bound in bounds:
            kind, inner = next(iter(bound.items())) if isinstance(bound, dict) else (bound, None)
            if kind == "trait_bound":
                modifier = {"none": "", "maybe": "?", "maybe_const": "~const "}[inner["modifier"]]
                hrtb = self.for_lifetimes(inner["generic_params"])
                out.append(f"{hrtb}{modifier}{self.path(inner['trait'])}")
            elif kind == "outlives":
                out.append(inner)
            elif kind == "use":
                out.append(f"use<{', '.join(map(self.use_arg, inner))}>")
            else:
                raise ValueError(f"bound {bound}")
        return " + ".join(out)

    @staticmethod
    def use_arg(arg):
        return arg if isinstance(arg, str) else next(iter(arg.values()))

    def path(self, path):
        """A resolved path: local items by their public path, others by their own."""
        item_id = str(path["id"])
        if item_id in self.public_path:
            name = "::".join(self.public_path[item_id])
        elif item_id in self.paths:
            name = "::".join(self.paths[item_id]["path"])
        else:
            name = path["path"]
        return name + self.args(path.get("args"))

    def args(self, args):
        if not args:
            return ""
        if "angle_bracketed" in args:
            inner = args["angle_bracketed"]
            rendered = [self.arg(arg) for arg in inner["args"]]
            for constraint in inner["constraints"]:
                name = constraint["name"] + self.args(constraint.get("args"))
                binding = constraint["binding"]
                if "equality" in binding:
                    rendered.append(f"{name} = {self.term(binding['equality'])}")
                else:
                    rendered.append(f"{name}: {self.bounds(binding['constraint'])}")
            return f"<{', '.join(rendered)}>" if rendered else ""
        if "parenthesized" in args:
            inner = args["parenthesized"]
            output = f" -> {self.ty(inner['output'])}" if inner["output"] else ""
            return f"({', '.join(map(self.ty, inner['inputs']))}){output}"
        return "(..)"

    def arg(self, arg):
        if arg == "infer":
            return "_"
        kind, inner = next(iter(arg.items()))
        if kind == "lifetime":
            return inner
        if kind == "type":
            return self.ty(inner)
        return inner.get("expr", "_") if isinstance(inner, dict) else str(inner)

    def term(self, term):
        return self.ty(term["type"]) if "type" in term else str(term["constant"].get("expr"))

    def ty(self, ty):
        if ty == "infer":
            return "_"
        kind, inner = next(iter(ty.items()))
        if kind == "resolved_path":
            return self.path(inner)
        if kind in ("generic", "primitive"):
            return inner
        if kind == "borrowed_ref":
            lifetime = f"{inner['lifetime']} " if inner["lifetime"] else ""
            return f"&{lifetime}{'mut ' if inner['is_mutable'] else ''}{self.ty(inner['type'])}"
        if kind == "raw_pointer":
            return f"*{'mut' if inner['is_mutable'] else 'const'} {self.ty(inner['type'])}"
        if kind == "tuple":
            types = [self.ty(t) for t in inner]
            return f"({types[0]},)" if len(types) == 1 else f"({', '.join(types)})"
        if kind == "slice":
            return f"[{self.ty(inner)}]"
        if kind == "array":
            return f"[{self.ty(inner['type'])}; {inner['len']}]"
        if kind == "impl_trait":
            return f"impl {self.bounds(inner)}"
        if kind == "dyn_trait":
            traits = [
                self.for_lifetimes(bound["generic_params"]) + self.path(bound["trait"])
                for bound in inner["traits"]
            ]
            if inner["lifetime"]:
                traits.append(inner["lifetime"])
            return f"dyn {' + '.join(traits)}"
        if kind == "function_pointer":
            params = ", ".join(self.ty(t) for _, t in inner["sig"]["inputs"])
            output = f" -> {self.ty(inner['sig']['output'])}" if inner["sig"]["output"] else ""
            hrtb = self.for_lifetimes(inner["generic_params"])
            return f"{hrtb}fn({params}){output}"
        if kind == "qualified_path":
            trait = f" as {self.path(inner['trait'])}" if inner["trait"] else ""
            return f"<{self.ty(inner['self_type'])}{trait}>::{inner['name']}" + self.args(
                inner.get("args")
            )
        if kind == "pat":
            return self.ty(inner["type"])
        raise ValueError(f"type {ty}")


if __name__ == "__main__":
    main()
