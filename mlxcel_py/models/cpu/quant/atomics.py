"""Atomic int64 counters for numba kernels (llvmlite IR): what a fused decode step's threads
claim work and wait on between products (quant/step.py), as ggml's threadpool does.

A waiter spins first (the usual wait is microseconds), then on Linux sleeps on the counter (futex)
until the thread that counts a task done wakes it. Spinning on, or sched_yield, kept the core busy
while the thread it waited for sat preempted on the other one (by the server's HTTP thread, or any
other process), so every barrier cost a whole time slice."""

from __future__ import annotations

import platform

from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

_X86 = platform.machine().lower() in ("x86_64", "amd64")
_I64 = ir.IntType(64)
# futex(2)'s syscall number where the step can sleep on a counter (x86-64 and arm64 Linux), else None
_SYS_FUTEX = {"x86_64": 202, "amd64": 202, "aarch64": 98, "arm64": 98}.get(platform.machine().lower()) \
    if platform.system() == "Linux" else None
FUTEX = _SYS_FUTEX is not None
_WAIT, _WAKE = 0 | 128, 1 | 128  # FUTEX_WAIT_PRIVATE, FUTEX_WAKE_PRIVATE


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


def _futex(builder, address, op, value, timeout):
    """syscall(SYS_futex, address, op, value, timeout): every argument as a long, as syscall() reads them."""
    fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_I64, [_I64], var_arg=True), "syscall")
    args = [ir.Constant(_I64, _SYS_FUTEX), builder.ptrtoint(address, _I64), ir.Constant(_I64, op), value, timeout]
    return builder.call(fn, args)


@intrinsic
def futex_wait(typingctx, arr, index, seen, timeout_ns):
    """Sleep while arr[index]'s low 32 bits equal `seen`'s, at most timeout_ns (a bound, not a wake:
    the caller re-checks); returns at once where futexes are absent."""
    if _int64_array(arr) and all(isinstance(t, types.Integer) for t in (index, seen, timeout_ns)):
        def codegen(context, builder, sig, args):
            if FUTEX:
                at = _slot(context, builder, sig.args[0], args[0], context.cast(builder, args[1], sig.args[1], types.intp))
                spec = cgutils.alloca_once(builder, ir.LiteralStructType([_I64, _I64]))
                ns = context.cast(builder, args[3], sig.args[3], types.int64)
                billion = ir.Constant(_I64, 1_000_000_000)
                builder.store(builder.sdiv(ns, billion), builder.gep(spec, [ir.Constant(ir.IntType(32), 0)] * 2))
                builder.store(builder.srem(ns, billion), builder.gep(spec, [ir.Constant(ir.IntType(32), 0), ir.Constant(ir.IntType(32), 1)]))
                low = builder.and_(context.cast(builder, args[2], sig.args[2], types.int64), ir.Constant(_I64, 0xFFFFFFFF))
                _futex(builder, at, _WAIT, low, builder.ptrtoint(spec, _I64))
            return context.get_dummy_value()

        return types.void(arr, index, seen, timeout_ns), codegen


@intrinsic
def futex_wake(typingctx, arr, index):
    """Wake every thread sleeping in futex_wait on arr[index]."""
    if _int64_array(arr) and isinstance(index, types.Integer):
        def codegen(context, builder, sig, args):
            if FUTEX:
                at = _slot(context, builder, sig.args[0], args[0], context.cast(builder, args[1], sig.args[1], types.intp))
                _futex(builder, at, _WAKE, ir.Constant(_I64, 2**31 - 1), ir.Constant(_I64, 0))
            return context.get_dummy_value()

        return types.void(arr, index), codegen


SPINS = 2000  # pauses (~100 ns each on Zen) before a waiter sleeps (yields its core where futexes are absent)
NAP_NS = 500_000  # the longest one sleep lasts before the waiter looks again (a lost wake costs no more)


@njit(cache=True, nogil=True, inline="always")
def wait_at_least(counters, index, target, sleepers):  # pragma: no cover - jitted
    """Spin until counters[index] >= target, then sleep on it: counters[sleepers] counts the threads
    asleep now (count_done wakes them), counters[sleepers + 1] every sleep so far."""
    spins = 0
    while load_acquire(counters, index) < target:
        spins += 1
        if spins <= SPINS or not FUTEX:
            relax(spins > SPINS)
            continue
        fetch_add(counters, sleepers, 1)  # seq_cst: count_done's later read of it sees this, or we see its count
        seen = load_acquire(counters, index)
        if seen < target:
            futex_wait(counters, index, seen, NAP_NS)
            fetch_add(counters, sleepers + 1, 1)
        fetch_add(counters, sleepers, -1)


@njit(cache=True, nogil=True, inline="always")
def count_done(counters, index, sleepers):  # pragma: no cover - jitted
    """counters[index] += 1, then wake wait_at_least's sleepers on it, if any."""
    fetch_add(counters, index, 1)
    if load_acquire(counters, sleepers) > 0:
        futex_wake(counters, index)
