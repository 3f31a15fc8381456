"""A replay engine self-test: can this process launch, reset, time and verify on ``device``?

The replay server's new workers run it before taking work, so a broken GPU,
driver or engine build shows up as a clear error at start-up instead of as
failed experiments. It needs no toolkit (the kernel is PTX for the driver JIT)
and no recording.
"""

from __future__ import annotations

import struct

from mneme.errors import MnemeError
from mneme.replay import engine as eng

# An in-place kernel (out[i] += i * mul + 1): it verifies only if every launch
# starts from the reset state, which is what the self-test wants to see.
SELF_TEST_PTX = """\
.version 7.5
.target sm_75
.address_size 64
.visible .entry mneme_self_test(
\t.param .u64 mneme_self_test_param_0,
\t.param .u32 mneme_self_test_param_1,
\t.param .u32 mneme_self_test_param_2
)
{
\t.reg .pred %p<2>;
\t.reg .b32 %r<10>;
\t.reg .b64 %rd<5>;
\tld.param.u64 %rd1, [mneme_self_test_param_0];
\tld.param.u32 %r3, [mneme_self_test_param_1];
\tld.param.u32 %r2, [mneme_self_test_param_2];
\tmov.u32 %r4, %ctaid.x;
\tmov.u32 %r5, %ntid.x;
\tmov.u32 %r6, %tid.x;
\tmad.lo.s32 %r1, %r4, %r5, %r6;
\tsetp.ge.u32 %p1, %r1, %r3;
\t@%p1 bra $L__done;
\tcvta.to.global.u64 %rd2, %rd1;
\tmul.wide.u32 %rd3, %r1, 4;
\tadd.s64 %rd4, %rd2, %rd3;
\tld.global.u32 %r7, [%rd4];
\tmad.lo.s32 %r8, %r1, %r2, %r7;
\tadd.s32 %r9, %r8, 1;
\tst.global.u32 [%rd4], %r9;
$L__done:
\tret;
}
"""

ELEMENTS = 4099  # not a multiple of the block: the bounds check matters
MUL = 7


class SelfTestError(MnemeError):
    """The engine cannot replay correctly in this process."""


def self_test(device: int = 0) -> None:
    """Launch, reset, time and verify a tiny in-place kernel; raise SelfTestError on any failure.

    Args:
        device: the CUDA device ordinal.

    Raises:
        NotAvailableError: no replay engine or driver here.
        SelfTestError: a step failed (the message says which).
    """
    native = eng.require_driver()
    try:
        _run(native, device)
    except SelfTestError:
        raise
    except native.CudaError as exc:
        raise SelfTestError(f"replay self-test on device {device} failed in the driver: {exc}") from None


def _run(native, device: int) -> None:
    ctx = eng.open_context(device)
    size = ELEMENTS * 4
    live, pristine, expected = ctx.alloc(size), ctx.alloc(size), ctx.alloc(size)
    try:
        initial = bytes(size)
        want = struct.pack(f"<{ELEMENTS}I", *((i * MUL + 1) & 0xFFFFFFFF for i in range(ELEMENTS)))
        ctx.upload(live.ptr, initial)
        ctx.upload(pristine.ptr, initial)
        ctx.upload(expected.ptr, want)
        module = ctx.load_module(SELF_TEST_PTX.encode(), {"optimization_level": 3})
        fn = module.function("mneme_self_test")
        args = struct.pack("<QII", live.ptr, ELEMENTS, MUL)
        block = 128
        grid = (ELEMENTS + block - 1) // block
        out = fn.run(
            (grid, 1, 1), (block, 1, 1), 0, args, 3,
            resets=[(live.ptr, pristine.ptr, size)],
            checks=[(live.ptr, expected.ptr, size, -1, False, 0.0)],
            check_launches=[0, 1, 2], timeout_s=10.0,
        )  # fmt: skip
        for launch, per_check in zip(out["checked_launches"], out["checks"]):
            differing = per_check[0][1][0]
            if differing:
                raise SelfTestError(
                    f"replay self-test on device {device}: launch {launch} left {differing} wrong bytes; "
                    "resets or launches do not work on this GPU"
                )
        if len(out["times_ns"]) != 3 or min(out["times_ns"]) <= 0:
            raise SelfTestError(f"replay self-test on device {device}: event timing gave {out['times_ns']}")
        # The comparison must be able to fail, too.
        (_, counters), = ctx.compare([(live.ptr, pristine.ptr, size, -1, False, 0.0)])
        if counters[0] == 0:
            raise SelfTestError(f"replay self-test on device {device}: the device comparison sees no difference")
    finally:
        for b in (live, pristine, expected):
            b.free()
