"""Atomic int64 counters for numba kernels (llvmlite IR): what a fused decode step's threads
claim work and wait on between products (quant/step.py), as ggml's threadpool does."""

from __future__ import annotations

import platform

from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

_X86 = platform.machine().lower() in ("x86_64", "amd64")
_I64 = ir.IntType(64)


def _slot(context, builder, array_type, array, index):
    data = context.make_array(array_type)(context, builder, array).data
    return builder.gep(data, [index])


def _int64_array(arr) -> bool:
    return isinstance(arr, types.Array) and arr.dtype == types.int64 and arr.layout == "C"


@intrinsic
def fetch_add(typingctx, arr, index, value):
    """arr[index] += value, atomically (sequentially consistent); returns the old value."""
    if _int64_array(arr) and isinstance(index, types.Integer) and isinstance(value, types.Integer):
        def codegen(context, builder, sig, args):
            at = _slot(context, builder, sig.args[0], args[0], context.cast(builder, args[1], sig.args[1], types.intp))
            add = context.cast(builder, args[2], sig.args[2], types.int64)
            return builder.atomic_rmw("add", at, add, "seq_cst")

        return types.int64(arr, index, value), codegen


@intrinsic
def load_acquire(typingctx, arr, index):
    """arr[index] read atomically with acquire ordering (what another thread published before)."""
    if _int64_array(arr) and isinstance(index, types.Integer):
        def codegen(context, builder, sig, args):
            at = _slot(context, builder, sig.args[0], args[0], context.cast(builder, args[1], sig.args[1], types.intp))
            return builder.load_atomic(at, "acquire", 8)

        return types.int64(arr, index), codegen


@intrinsic
def relax(typingctx, yield_cpu):
    """One spin-wait step: x86's `pause`; with `yield_cpu`, sched_yield() too (a shared machine:
    the thread we wait on may need this core)."""
    if isinstance(yield_cpu, types.Boolean):
        def codegen(context, builder, sig, args):
            if _X86:
                builder.call(cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.VoidType(), []),
                                                            "llvm.x86.sse2.pause"), [])
            with builder.if_then(args[0]):
                fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.IntType(32), []), "sched_yield")
                builder.call(fn, [])
            return context.get_dummy_value()

        return types.void(yield_cpu), codegen


SPINS = 2000  # pauses (~100 ns each on Zen) before a waiter starts yielding its core


@njit(cache=True, nogil=True, inline="always")
def wait_at_least(counters, index, target):  # pragma: no cover - jitted
    """Spin until counters[index] >= target."""
    spins = 0
    while load_acquire(counters, index) < target:
        spins += 1
        relax(spins > SPINS)
