#!/usr/bin/env python3
"""Writes kcache's protobuf schema table from a Kubernetes source tree.

    scripts/gen-proto-schema.py KUBERNETES_TREE VERSION > actors/src/core/proto/k8s.schema

KUBERNETES_TREE has the staging modules under staging/src/k8s.io/ (api, apimachinery,
kube-aggregator; symlinks are followed): scripts/k8s/gen-proto-schema.sh lays one out from
the Go module cache at the reference version and runs this. Read from it: every
`generated.proto` of the built-in API groups, plus the API machinery types they use, and
each group's name from its `register.go`. kcache encodes cached objects as protobuf with this table
(actors/src/core/proto/); it is the wire contract of the API server it was generated from.

The output is kcache's own line format, one record per line:

    P <package> <group> <version>        a proto package: the API group version it serves
                                         ("" is the core group, - no group: machinery)
    M <message> [[]]                     a message of the last package; `[]` marks a Go
                                         []string type: a JSON array, `items` in protobuf
    F <number> <name> <o|r|m|i> <type>   a field of the last message: optional, repeated,
                                         map<string, type>, or inline (a Go struct embedded
                                         with `json:",inline"`: its fields are the parent's
                                         in JSON, a nested message in protobuf)

Types are the proto scalar names (string, int32, int64, bool, bytes, double) or a message's
full name. Field names are the JSON names (the generator writes them so).

apiextensions (CustomResourceDefinition) is left out: its JSONSchemaProps has JSON names
that are not its proto names and hand-written JSON forms; CRDs are served as JSON.
"""

import os
import re
import sys

SCALARS = {"string", "int32", "int64", "bool", "bytes", "double"}

# The proto packages kcache encodes: the built-in API groups and the machinery they use.
INCLUDE = (
    "staging/src/k8s.io/api/",
    "staging/src/k8s.io/apimachinery/pkg/apis/meta/v1/",
    "staging/src/k8s.io/apimachinery/pkg/api/resource/",
    "staging/src/k8s.io/apimachinery/pkg/runtime/",
    "staging/src/k8s.io/apimachinery/pkg/util/intstr/",
    "staging/src/k8s.io/kube-aggregator/pkg/apis/apiregistration/",
)
EXCLUDE = ("/testdata/", "/runtime/schema/")

FIELD = re.compile(
    r"^(optional|repeated|required)\s+([A-Za-z0-9_.]+)\s+(\w+)\s*=\s*(\d+)\s*(\[.*\])?;$"
)
MAP = re.compile(r"^map<\s*string\s*,\s*([A-Za-z0-9_.]+)\s*>\s+(\w+)\s*=\s*(\d+)\s*;$")


def strip_comments(text):
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    return "\n".join(line.split("//", 1)[0] for line in text.splitlines())


def group_of(proto_dir):
    reg = os.path.join(proto_dir, "register.go")
    if not os.path.exists(reg):
        return None
    with open(reg) as f:
        m = re.search(r'GroupName\s*=\s*"([^"]*)"', f.read())
    return m.group(1) if m else None


TAGS = re.compile(r'`json:"([^"]*)"[^`]*protobuf:"[a-z0-9]+,(\d+),')
STRUCT = re.compile(r"^type (\w+) struct \{")
SLICE = re.compile(r"^type (\w+) \[\]string$")


def go_tags(proto_dir):
    """{(message, field number): JSON name} from the Go types' tags. An empty name is a
    field whose JSON is inlined into its parent's (`json:",inline"`): in protobuf it is a
    nested message, in JSON its fields sit beside the parent's own. The proto field name
    is not always the JSON one (`uID` for `uid`)."""
    found = {}
    for name in sorted(os.listdir(proto_dir)):
        if not (name.startswith("types") and name.endswith(".go")):
            continue
        struct = None
        with open(os.path.join(proto_dir, name)) as f:
            for line in f:
                m = STRUCT.match(line)
                if m:
                    struct = m.group(1)
                m = SLICE.match(line)
                if m:
                    # A named []string (ExtraValue, Verbs): a JSON array, a message with
                    # a repeated `items` in protobuf.
                    found[(m.group(1), 0)] = "[]"
                m = TAGS.search(line)
                if m and struct:
                    opts = m.group(1).split(",")
                    found[(struct, int(m.group(2)))] = "" if "inline" in opts[1:] else opts[0]
    return found


def parse(path):
    with open(path) as f:
        text = strip_comments(f.read())
    package = re.search(r"^package\s+([\w.]+)\s*;", text, flags=re.M).group(1)
    messages = []
    depth = 0
    current = None
    for raw in text.splitlines():
        line = raw.strip()
        if not line:
            continue
        m = re.match(r"^message\s+(\w+)\s*\{$", line)
        if m:
            if depth != 0:
                sys.exit(f"{path}: nested message {m.group(1)} not supported")
            current = (m.group(1), [])
            messages.append(current)
            depth = 1
            continue
        if depth == 1 and line == "}":
            depth = 0
            current = None
            continue
        if current is None:
            continue
        fm = FIELD.match(line)
        mm = MAP.match(line)
        if fm:
            label, ty, name, num, _ = fm.groups()
            current[1].append((int(num), name, "r" if label == "repeated" else "o", ty))
        elif mm:
            ty, name, num = mm.groups()
            current[1].append((int(num), name, "m", ty))
        else:
            sys.exit(f"{path}: cannot read {line!r}")
    return package, messages


def qualify(ty, package, known):
    if ty in SCALARS:
        return ty
    if ty.startswith("."):
        ty = ty[1:]
    if ty in known:
        return ty
    if f"{package}.{ty}" in known:
        return f"{package}.{ty}"
    sys.exit(f"unknown type {ty} in {package}")


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    tree, version = sys.argv[1], sys.argv[2]
    files = []
    for root, _, names in os.walk(os.path.join(tree, "staging/src/k8s.io"), followlinks=True):
        for n in names:
            if n != "generated.proto":
                continue
            p = os.path.join(root, n)
            rel = os.path.relpath(p, tree)
            if any(rel.startswith(i) for i in INCLUDE) and not any(e in rel for e in EXCLUDE):
                files.append(p)
    files.sort()
    parsed = [(p,) + parse(p) for p in files]
    known = {f"{pkg}.{name}" for _, pkg, msgs in parsed for name, _ in msgs}
    print("# kcache protobuf schema: generated by scripts/gen-proto-schema.py from the")
    print(f"# Kubernetes {version} sources (generated.proto, register.go). Do not edit.")
    for path, package, messages in parsed:
        group = group_of(os.path.dirname(path))
        tags = go_tags(os.path.dirname(path))
        version = package.rsplit(".", 1)[1]
        gname = "-" if group is None else (group or '""')
        print(f"P {package} {gname} {version}")
        for name, fields in messages:
            print(f"M {name}" + (" []" if tags.get((name, 0)) == "[]" else ""))
            for num, fname, label, ty in sorted(fields):
                json_name = tags.get((name, num), fname)
                if json_name == "":
                    label = "i"
                elif json_name != "-":
                    fname = json_name
                print(f"F {num} {fname} {label} {qualify(ty, package, known)}")


if __name__ == "__main__":
    main()
