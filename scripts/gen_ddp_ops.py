#!/usr/bin/env python3
"""Generates burn-ddp's op delegation for `Ddp<B>` from burn-backend's op traits.

`Ddp<B>` must forward every backend operation to `B`, including the methods
that have default bodies: a default left in place would run burn-backend's
generic implementation instead of `B`'s override (Autodiff's fused backward for
relu, softmax or conv, say). The traits hold about 430 methods, so they are
read from the burn-backend sources that cargo resolved and written out, one
file per op family, as plain forwarding calls. An op with a float result
first shows its float inputs to the overlap (`crate::overlap::Uses`), which
may route a parameter through its readiness hook (docs/overlap.md).

Usage: python3 scripts/gen_ddp_ops.py   (from the repository root; needs cargo)
Re-run it whenever the pinned Burn version changes, then `cargo fmt`.
"""

import json
import re
import subprocess
import sys
from pathlib import Path

OUT_DIR = Path("burn-ddp/src/backend/ops")

# (source file under burn-backend/src/backend/ops, trait, output module)
TRAITS = [
    ("tensor.rs", "FloatTensorOps", "float"),
    ("int_tensor.rs", "IntTensorOps", "int"),
    ("bool_tensor.rs", "BoolTensorOps", "bool"),
    ("modules/base.rs", "ModuleOps", "module"),
    ("activation.rs", "ActivationOps", "activation"),
    ("qtensor.rs", "QTensorOps", "qtensor"),
    ("transaction.rs", "TransactionOps", "transaction"),
]

# Types generic over the backend that are not plain associated types: values of
# them cross between `Ddp<B>` and `B` through the converters in `convert.rs`.
CONVERT_IN = {
    "TensorPrimitive": "primitive_to_inner",
    "QuantizationParametersPrimitive": "qparams_to_inner",
    "TransactionPrimitive": "transaction_to_inner",
}
CONVERT_OUT = {
    "TensorPrimitive": "primitive_from_inner",
    "DeformConv2dBackward": "deform_conv2d_backward_from_inner",
    "MaxPool1dWithIndices": "max_pool1d_with_indices_from_inner",
    "MaxPool1dBackward": "max_pool1d_backward_from_inner",
    "MaxPool2dWithIndices": "max_pool2d_with_indices_from_inner",
    "MaxPool2dBackward": "max_pool2d_backward_from_inner",
}

# Methods burn-ddp intercepts: name -> call (arguments keep their names).
HOOKS = {
    "float_set_require_grad": (
        "// Layers generic over any backend (SyncBatchNorm) reach the tracked sum by type.\n"
        "        crate::autograd::enable_sync_batch_norm::<Self>();\n"
        "        crate::tracking::set_require_grad::<B>(tensor, require_grad)"
    ),
}

# Float inputs an op shows to the overlap (burn-ddp/src/overlap/forward.rs)
# before it runs, so a parameter's first use in a step can put it behind its
# readiness hook: argument type -> (see, route) methods of `Uses`.
FLOAT_INPUTS = {
    "FloatTensor<B>": ("see", "route"),
    "Option<FloatTensor<B>>": ("see_opt", "route_opt"),
    "Vec<FloatTensor<B>>": ("see_all", "route_all"),
}
# Ops with a float result that is no use of their input in the graph.
NOT_USES = {"float_detach", "float_set_require_grad"}


def burn_backend_dir() -> Path:
    meta = json.loads(
        subprocess.check_output(["cargo", "metadata", "--format-version", "1"], text=True)
    )
    for package in meta["packages"]:
        if package["name"] == "burn-backend":
            return Path(package["manifest_path"]).parent, package["version"]
    sys.exit("burn-backend is not in the dependency graph")


def strip_comments(src: str) -> str:
    """Removes // and /* */ comments outside string and char literals."""
    out, i, n = [], 0, len(src)
    while i < n:
        c = src[i]
        if src.startswith("//", i):
            while i < n and src[i] != "\n":
                i += 1
        elif src.startswith("/*", i):
            i = src.index("*/", i) + 2
        elif c == '"':
            j = i + 1
            while src[j] != '"':
                j += 2 if src[j] == "\\" else 1
            out.append(src[i : j + 1])
            i = j + 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def matching(src: str, start: int, open_c: str, close_c: str) -> int:
    depth = 0
    for i in range(start, len(src)):
        if src[i] == open_c:
            depth += 1
        elif src[i] == close_c:
            depth -= 1
            if depth == 0:
                return i
    raise ValueError("unbalanced")


def split_top(text: str, sep: str = ","):
    parts, depth, cur = [], 0, []
    for c in text.replace("->", "\0"):
        if c in "(<[":
            depth += 1
        elif c in ")>]":
            depth -= 1
        if c == sep and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(c)
    if "".join(cur).strip():
        parts.append("".join(cur))
    return [p.replace("\0", "->").strip() for p in parts if p.strip()]


def methods(body: str):
    """Yields (attributes, signature) for each fn at the top level of a trait body."""
    i, attrs = 0, []
    while i < len(body):
        if body.startswith("#[", i):
            end = matching(body, i + 1, "[", "]")
            attrs.append(body[i : end + 1])
            i = end + 1
        elif re.match(r"fn\s", body[i : i + 3]):
            j, depth = i, 0
            text = body.replace("->", "\0\0")
            while True:
                c = text[j]
                if c in "(<[":
                    depth += 1
                elif c in ")>]":
                    depth -= 1
                elif depth == 0 and c in ";{":
                    break
                j += 1
            yield attrs, body[i:j].strip()
            attrs = []
            i = body.index("}", j) if body[j] == "{" and False else j
            if body[j] == "{":
                i = matching(body, j, "{", "}") + 1
            else:
                i = j + 1
        elif body[i].isspace():
            i += 1
        else:
            i += 1
    return


def generate(trait_src: str, trait: str, backend_version: str):
    src = strip_comments(trait_src)
    head = src.index(f"pub trait {trait}<B: Backend>")
    start = src.index("{", head)
    body = src[start + 1 : matching(src, start, "{", "}")]
    items = []
    for attrs, sig in methods(body):
        if any("distributed" in a for a in attrs):
            continue  # burn's `distributed` feature stays off (see docs/design.md)
        m = re.match(r"fn\s+(\w+)\s*(<[^(]*>)?\s*\(", sig)
        name = m.group(1)
        open_paren = m.end() - 1
        close_paren = matching(sig, open_paren, "(", ")")
        params = split_top(sig[open_paren + 1 : close_paren])
        rest = sig[close_paren + 1 :].strip()
        args, typed, floats = [], [], []
        for p in params:
            pname, ptype = p.split(":", 1)
            # Every argument is forwarded, so none stays "unused".
            pname = pname.replace("mut ", "").strip().lstrip("_")
            ptype = ptype.strip().replace("crate::", "burn_backend::")
            typed.append(f"{pname}: {ptype}")
            if ptype in FLOAT_INPUTS:
                floats.append((pname, FLOAT_INPUTS[ptype]))
            base = re.match(r"(\w+)<B>", ptype)
            if base and base.group(1) in CONVERT_IN:
                args.append(f"convert::{CONVERT_IN[base.group(1)]}::<B>({pname})")
            else:
                args.append(pname)
        call = HOOKS.get(name) or f"B::{name}({', '.join(args)})"
        ret = re.match(r"->\s*(\w+)<B>\s*$", rest)
        if ret and ret.group(1) in CONVERT_OUT and name not in HOOKS:
            call = f"convert::{CONVERT_OUT[ret.group(1)]}::<B>({call})"
        float_result = "FloatTensor<B>" in rest or (ret and ret.group(1) in CONVERT_OUT)
        if floats and float_result and name not in NOT_USES:
            call = routed(floats, call, re.fullmatch(r"->\s*FloatTensor<B>", rest) is not None)
        generics = m.group(2) or ""
        rest = rest.replace("crate::", "burn_backend::")
        signature = f"fn {name}{generics}({', '.join(typed)}) {rest}"
        signature = re.sub(r"\bB\b", "Self", signature)
        items.append(f"    {signature} {{\n        {call}\n    }}\n")
    return items


def routed(floats, call: str, registers_output: bool) -> str:
    """`call` with its float inputs shown to the overlap and routed first."""
    lines = ["let mut uses = crate::overlap::Uses::new();"]
    lines += [f"uses.{see}::<B>(&{name});" for name, (see, _) in floats]
    lines += [f"let {name} = uses.{route}::<B>({name});" for name, (_, route) in floats]
    lines.append(f"uses.output::<B>({call})" if registers_output else call)
    return "\n        ".join(lines)


HEADER = """// @generated by scripts/gen_ddp_ops.py from burn-backend {version}; do not edit.
//
// Every method of `{trait}` forwards to `B`, defaulted ones included, so the
// wrapped backend's own implementations (and overrides) are the ones that run.

#![allow(unused_imports, clippy::too_many_arguments)]

use super::convert;
use crate::backend::Ddp;
use crate::tracking::TrackedAutodiff;
use burn_backend::ops::*;
use burn_backend::quantization::*;
use burn_backend::tensor::{{BoolTensor, Device, FloatTensor, IntTensor, QuantizedTensor}};
use burn_backend::{{
    Backend, BoolDType, DType, Distribution, ExecutionError, FloatDType, IntDType, Scalar, Shape,
    Slice, TensorData, TensorPrimitive,
}};
use core::future::Future;
use core::ops::Range;

impl<B: TrackedAutodiff> {trait}<Self> for Ddp<B> {{
"""


def main():
    root, version = burn_backend_dir()
    ops_dir = root / "src" / "backend" / "ops"
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    total = 0
    for file, trait, module in TRAITS:
        items = generate((ops_dir / file).read_text(), trait, version)
        total += len(items)
        text = HEADER.format(version=version, trait=trait) + "\n".join(items) + "}\n"
        (OUT_DIR / f"{module}.rs").write_text(text)
        print(f"{module}.rs: {len(items)} methods of {trait}")
    print(f"{total} methods in all")


if __name__ == "__main__":
    main()
