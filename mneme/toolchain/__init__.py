"""Build side of the LLVM tier: compiler wrappers that embed kernel bitcode (see docs/llvm-tier.md).

Everything here uses the standard library only: it runs inside users' builds.
"""
