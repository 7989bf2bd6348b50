"""io_uring in numba: ring set-up and the submit/reap loop of a batch of reads.

No binding and no Python per read. The three io_uring system calls go through
libc's ``syscall`` (and the rings through libc's ``mmap``), declared by symbol
name in the generated code (:func:`_libc_syscall`): the JIT resolves the
symbol when the code is loaded, so, unlike a ctypes function pointer, whose
address numba would embed, the kernels can be cached (``cache=True``). The
io_uring syscall numbers (425-427) are the same on every architecture.

Memory ordering (the kernel's head/tail protocol, ``io_uring(7)``): the
kernel writes the CQ tail and the SQ head, we write the SQ tail and the CQ
head. Loads of the kernel's indices are LLVM ``load atomic ... acquire``
(:func:`_ld_acq_u32`) and stores of ours are ``store atomic ... release``
(:func:`_st_rel_u32`), so CQE reads cannot move before the tail load and SQE
writes cannot move after the tail store, neither in the compiler nor in the
CPU. On x86-64 both compile to plain ``mov`` (TSO) and only constrain the
compiler; on weaker CPUs LLVM adds the barriers.

State of an open ring: an int64 array ``st`` of :data:`NSTATE` fields, indexed
by the ``S_*`` constants (addresses of the mmapped ring fields, masks, sizes
and our SQ tail). A read batch is *runs*: ``lens[i]`` bytes at file offset
``offs[i]`` into memory at ``base + bufs[i]`` (int64 ``[n]``); run i's
``user_data`` is i.
"""
from __future__ import annotations

import numba as nb
import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

# system calls and ABI constants (linux/io_uring.h, asm-generic/mman.h)
SYS_IO_URING_SETUP = 425
SYS_IO_URING_ENTER = 426
SYS_IO_URING_REGISTER = 427
IORING_OFF_SQ_RING = 0
IORING_OFF_CQ_RING = 0x8000000
IORING_OFF_SQES = 0x10000000
IORING_FEAT_SINGLE_MMAP = 1
IORING_SETUP_CLAMP = 1 << 4
IORING_SETUP_COOP_TASKRUN = 1 << 8
IORING_ENTER_GETEVENTS = 1
IORING_OP_READ_FIXED = 4
IORING_OP_READ = 22
IOSQE_FIXED_FILE = 1
IORING_REGISTER_BUFFERS = 0
IORING_UNREGISTER_BUFFERS = 1
IORING_REGISTER_FILES = 2
PROT_READ_WRITE = 0x3
MAP_SHARED_POPULATE = 0x01 | 0x8000
SQE_BYTES = 64
CQE_BYTES = 16
MAX_SQE_BYTES = 1 << 30
EINTR = 4
EAGAIN = 11
EBUSY = 16
EINVAL = 22

# fields of ``st``
S_RING_FD = 0
S_SQ_HEAD = 1      # address of the kernel's SQ head (u32)
S_SQ_TAIL = 2      # address of the SQ tail (u32, ours)
S_SQ_MASK = 3
S_SQ_ENTRIES = 4
S_SQES = 5         # address of the SQE array
S_CQ_HEAD = 6      # address of the CQ head (u32, ours)
S_CQ_TAIL = 7      # address of the kernel's CQ tail (u32)
S_CQ_MASK = 8
S_CQ_ENTRIES = 9
S_CQES = 10        # address of the CQE array
S_SQ_MAP = 11      # mapping of the SQ ring (and the CQ ring with a single mmap)
S_SQ_MAP_LEN = 12
S_CQ_MAP = 13      # mapping of the CQ ring, 0 when shared with the SQ ring's
S_CQ_MAP_LEN = 14
S_SQES_MAP_LEN = 15
S_SQ_TAIL_LOCAL = 16  # our SQ tail (the ring's copy is written with release stores)
S_FEATURES = 17
S_SETUP_FLAGS = 18
NSTATE = 19

# return codes of read_runs (>= 0), a negative value is -errno of io_uring_enter
OK = 0
READ_FAILED = 1    # err[0]: run index, err[1]: bytes read before, err[2]: the result


# ------------------------------------------------------------------ libc and raw memory
def _libc_fn(builder, name: str, ret, args, var_arg: bool = False):
    fnty = ir.FunctionType(ret, args, var_arg=var_arg)
    return cgutils.get_or_insert_function(builder.module, fnty, name)


def _errno_value(builder):
    i32 = ir.IntType(32)
    loc = builder.call(_libc_fn(builder, "__errno_location", i32.as_pointer(), []), [])
    return builder.sext(builder.load(loc), ir.IntType(64))


def _minus_errno_if(builder, r, failed):
    """``r``, or -errno where ``failed`` (an i1) holds."""
    return builder.select(failed, builder.neg(_errno_value(builder)), r)


@intrinsic
def _libc_syscall(typingctx, nr, a1, a2, a3, a4, a5, a6):
    """``syscall(nr, a1..a6)`` through libc; the result, or -errno on failure."""
    i64 = types.int64
    sig = i64(i64, i64, i64, i64, i64, i64, i64)

    def codegen(context, builder, signature, args):
        t = ir.IntType(64)
        fn = _libc_fn(builder, "syscall", t, [t], var_arg=True)
        r = builder.call(fn, list(args))
        return _minus_errno_if(builder, r, builder.icmp_signed("==", r, t(-1)))

    return sig, codegen


@intrinsic
def _libc_mmap(typingctx, length, prot, flags, fd, offset):
    """``mmap(NULL, length, prot, flags, fd, offset)``: the address, or -errno."""
    i64 = types.int64
    sig = i64(i64, i64, i64, i64, i64)

    def codegen(context, builder, signature, args):
        t, i32, vp = ir.IntType(64), ir.IntType(32), ir.IntType(8).as_pointer()
        fn = _libc_fn(builder, "mmap", vp, [vp, t, i32, i32, i32, t])
        length_, prot_, flags_, fd_, off_ = args
        p = builder.call(fn, [vp(None), length_, builder.trunc(prot_, i32),
                              builder.trunc(flags_, i32), builder.trunc(fd_, i32), off_])
        r = builder.ptrtoint(p, t)
        return _minus_errno_if(builder, r, builder.icmp_signed("==", r, t(-1)))

    return sig, codegen


@intrinsic
def _libc_munmap(typingctx, addr, length):
    sig = types.int64(types.int64, types.int64)

    def codegen(context, builder, signature, args):
        t, i32, vp = ir.IntType(64), ir.IntType(32), ir.IntType(8).as_pointer()
        fn = _libc_fn(builder, "munmap", i32, [vp, t])
        r = builder.sext(builder.call(fn, [builder.inttoptr(args[0], vp), args[1]]), t)
        return _minus_errno_if(builder, r, builder.icmp_signed("<", r, t(0)))

    return sig, codegen


@intrinsic
def _libc_close(typingctx, fd):
    sig = types.int64(types.int64)

    def codegen(context, builder, signature, args):
        t, i32 = ir.IntType(64), ir.IntType(32)
        fn = _libc_fn(builder, "close", i32, [i32])
        r = builder.sext(builder.call(fn, [builder.trunc(args[0], i32)]), t)
        return _minus_errno_if(builder, r, builder.icmp_signed("<", r, t(0)))

    return sig, codegen


def _load(bits: int, signed: bool, ordering: str | None):
    @intrinsic
    def load(typingctx, addr):
        def codegen(context, builder, signature, args):
            it = ir.IntType(bits)
            p = builder.inttoptr(args[0], it.as_pointer())
            v = (builder.load_atomic(p, ordering, bits // 8) if ordering
                 else builder.load(p, align=bits // 8))
            ext = builder.sext if signed else builder.zext
            return ext(v, ir.IntType(64)) if bits < 64 else v

        return types.int64(types.int64), codegen

    return load


def _store(bits: int, ordering: str | None):
    @intrinsic
    def store(typingctx, addr, value):
        def codegen(context, builder, signature, args):
            it = ir.IntType(bits)
            p = builder.inttoptr(args[0], it.as_pointer())
            v = builder.trunc(args[1], it) if bits < 64 else args[1]
            if ordering:
                builder.store_atomic(v, p, ordering, bits // 8)
            else:
                builder.store(v, p, align=bits // 8)
            return context.get_dummy_value()

        return types.none(types.int64, types.int64), codegen

    return store


_ld_u32 = _load(32, False, None)
_ld_i32 = _load(32, True, None)
_ld_u64 = _load(64, False, None)
_ld_acq_u32 = _load(32, False, "acquire")
_st_u32 = _store(32, None)
_st_u64 = _store(64, None)
_st_rel_u32 = _store(32, "release")


# ------------------------------------------------------------------------------ ring
@nb.njit(cache=True, nogil=True)
def ring_open(entries, flags, st):
    """Create a ring of ``entries`` SQEs (``io_uring_setup`` with ``flags``) and map it.

    Fills ``st`` (int64 ``[NSTATE]``). Returns 0, or -errno of the failing
    call (nothing is left open then).
    """
    p = np.zeros(30, np.uint32)  # struct io_uring_params, 120 bytes
    p[2] = flags
    fd = _libc_syscall(SYS_IO_URING_SETUP, entries, p.ctypes.data, 0, 0, 0, 0)
    if fd < 0:
        return fd
    maps = _map_rings(fd, p)
    if maps[0] < 0:
        _libc_close(fd)
        return maps[0]
    _fill_state(st, fd, flags, p, maps)
    return 0


@nb.njit(cache=True, nogil=True)
def _map_rings(fd, p):
    """Map the SQ ring, the CQ ring (unless the kernel maps both at once) and the SQE
    array of the ring ``fd`` set up with params ``p`` (uint32 [30]). Returns ``(status,
    sq, sq_len, cq, cq_len, sqes, sqes_len)``: status 0, or -errno with nothing mapped.
    ``cq_len`` is 0 when the CQ ring shares the SQ ring's mapping."""
    sq_entries = np.int64(p[0])
    cq_entries = np.int64(p[1])
    # sq_off: head, tail, ring_mask, ring_entries, flags, dropped, array (u32 10..16)
    # cq_off: head, tail, ring_mask, ring_entries, overflow, cqes, flags (u32 20..26)
    sq_len = np.int64(p[16]) + sq_entries * 4
    cq_len = np.int64(p[25]) + cq_entries * CQE_BYTES
    single = (np.int64(p[5]) & IORING_FEAT_SINGLE_MMAP) != 0
    if single:
        sq_len = max(sq_len, cq_len)
        cq_len = 0
    sq = _libc_mmap(sq_len, PROT_READ_WRITE, MAP_SHARED_POPULATE, fd, IORING_OFF_SQ_RING)
    if sq < 0:
        return sq, 0, 0, 0, 0, 0, 0
    cq = sq
    if not single:
        cq = _libc_mmap(cq_len, PROT_READ_WRITE, MAP_SHARED_POPULATE, fd, IORING_OFF_CQ_RING)
        if cq < 0:
            _libc_munmap(sq, sq_len)
            return cq, 0, 0, 0, 0, 0, 0
    sqes_len = sq_entries * SQE_BYTES
    sqes = _libc_mmap(sqes_len, PROT_READ_WRITE, MAP_SHARED_POPULATE, fd, IORING_OFF_SQES)
    if sqes < 0:
        if not single:
            _libc_munmap(cq, cq_len)
        _libc_munmap(sq, sq_len)
        return sqes, 0, 0, 0, 0, 0, 0
    return 0, sq, sq_len, cq, cq_len, sqes, sqes_len


@nb.njit(cache=True, nogil=True)
def _fill_state(st, fd, flags, p, maps):
    """``st`` (int64 [NSTATE]) for the ring ``fd`` and its mappings (:func:`_map_rings`);
    SQ slot k is pointed at SQE k for good (the kernel reads SQEs through that index
    array)."""
    _, sq, sq_len, cq, cq_len, sqes, sqes_len = maps
    sq_entries = np.int64(p[0])
    st[S_RING_FD] = fd
    st[S_SQ_HEAD] = sq + np.int64(p[10])
    st[S_SQ_TAIL] = sq + np.int64(p[11])
    st[S_SQ_MASK] = _ld_u32(sq + np.int64(p[12]))
    st[S_SQ_ENTRIES] = sq_entries
    st[S_SQES] = sqes
    st[S_CQ_HEAD] = cq + np.int64(p[20])
    st[S_CQ_TAIL] = cq + np.int64(p[21])
    st[S_CQ_MASK] = _ld_u32(cq + np.int64(p[22]))
    st[S_CQ_ENTRIES] = np.int64(p[1])
    st[S_CQES] = cq + np.int64(p[25])
    st[S_SQ_MAP] = sq
    st[S_SQ_MAP_LEN] = sq_len
    st[S_CQ_MAP] = 0 if cq_len == 0 else cq
    st[S_CQ_MAP_LEN] = cq_len
    st[S_SQES_MAP_LEN] = sqes_len
    st[S_SQ_TAIL_LOCAL] = _ld_u32(st[S_SQ_TAIL])
    st[S_FEATURES] = np.int64(p[5])
    st[S_SETUP_FLAGS] = flags
    array = sq + np.int64(p[16])
    for k in range(sq_entries):
        _st_u32(array + 4 * k, k)


@nb.njit(cache=True, nogil=True)
def ring_close(st):
    """Unmap the ring and close its descriptor (in-flight requests are cancelled by the
    kernel). Idempotent: ``st[S_RING_FD]`` becomes -1."""
    fd = st[S_RING_FD]
    if fd < 0:
        return 0
    _libc_munmap(st[S_SQES], st[S_SQES_MAP_LEN])
    if st[S_CQ_MAP] != 0:
        _libc_munmap(st[S_CQ_MAP], st[S_CQ_MAP_LEN])
    _libc_munmap(st[S_SQ_MAP], st[S_SQ_MAP_LEN])
    st[S_RING_FD] = -1
    return _libc_close(fd)


@nb.njit(cache=True, nogil=True)
def ring_register(st, opcode, arg, nr_args):
    """``io_uring_register(ring, opcode, arg, nr_args)``: >= 0, or -errno (EINTR retried)."""
    while True:
        r = _libc_syscall(SYS_IO_URING_REGISTER, st[S_RING_FD], opcode, arg, nr_args, 0, 0)
        if r != -EINTR:
            return r


@nb.njit(cache=True, nogil=True)
def _push_read(st, sq_tail, fd, sqe_flags, off, nbytes, addr, buf_index, user_data):
    """Write one read SQE into the slot of ``sq_tail`` (READ_FIXED when ``buf_index`` >= 0)."""
    sqe = st[S_SQES] + (sq_tail & st[S_SQ_MASK]) * SQE_BYTES
    op = IORING_OP_READ if buf_index < 0 else IORING_OP_READ_FIXED
    # opcode u8 | flags u8 | ioprio u16 | fd s32
    _st_u64(sqe, op | (sqe_flags << 8) | ((fd & 0xFFFFFFFF) << 32))
    _st_u64(sqe + 8, off)
    _st_u64(sqe + 16, addr)
    _st_u64(sqe + 24, nbytes)            # len u32 | rw_flags u32 (0)
    _st_u64(sqe + 32, user_data)
    _st_u64(sqe + 40, max(buf_index, 0))  # buf_index u16 | personality u16 | file_index s32
    _st_u64(sqe + 48, 0)
    _st_u64(sqe + 56, 0)


@nb.njit(cache=True, nogil=True)
def read_runs(st, fd, fixed_file, offs, lens, bufs, base, buf_index, queue_depth, err):
    """Read every run through the ring, keeping ``queue_depth`` reads in flight.

    Args:
        st: the ring (:func:`ring_open`).
        fd: the file descriptor, or its index in the registered files when ``fixed_file``.
        offs, lens, bufs: int64 ``[n]``: run i reads ``lens[i]`` bytes at file offset
            ``offs[i]`` into memory at ``base + bufs[i]``.
        buf_index: registered buffer holding every target (``IORING_OP_READ_FIXED``),
            or -1 (``IORING_OP_READ``).
        err: int64 ``[3]``, set on ``READ_FAILED``: run index, bytes it read before
            the failure, and the failing result (0: end of file, < 0: -errno).

    A short read is resubmitted for its remainder (a run over ``MAX_SQE_BYTES`` is read
    in several SQEs that way); ``-EAGAIN``/``-EINTR`` results
    are resubmitted. After the first failure nothing new is submitted and the
    reads in flight are reaped, so none is left writing into the buffer. Returns
    ``OK``, ``READ_FAILED``, or -errno when ``io_uring_enter`` itself fails
    (reads may then still be in flight).
    """
    n = offs.shape[0]
    qd = min(queue_depth, st[S_SQ_ENTRIES])
    sqe_flags = IOSQE_FIXED_FILE if fixed_file else 0
    sq_tail = st[S_SQ_TAIL_LOCAL]
    cq_head = _ld_u32(st[S_CQ_HEAD])
    done = np.zeros(n, np.int64)   # bytes of each run read so far
    redo = np.empty(qd, np.int64)  # runs to resubmit (at most one per read in flight)
    nredo = 0
    nxt = 0
    inflight = 0
    failed = False
    status = OK
    while True:
        if not failed:
            sq_tail, nxt, nredo, inflight = _fill_queue(
                st, fd, sqe_flags, offs, lens, bufs, base, buf_index, qd, done, redo, nredo,
                nxt, inflight, sq_tail)
        if inflight == 0:
            break
        to_submit = (sq_tail - _ld_acq_u32(st[S_SQ_HEAD])) & 0xFFFFFFFF
        wait = _ld_acq_u32(st[S_CQ_TAIL]) == cq_head
        if to_submit or wait:
            r = _libc_syscall(SYS_IO_URING_ENTER, st[S_RING_FD], to_submit, 1 if wait else 0,
                              IORING_ENTER_GETEVENTS if wait else 0, 0, 0)
            if r < 0 and r != -EINTR and r != -EAGAIN and r != -EBUSY:
                status = r
                break
        cq_head, inflight, nredo, failed, status = _reap(
            st, lens, done, redo, nredo, cq_head, inflight, failed, status, err)
    st[S_SQ_TAIL_LOCAL] = sq_tail
    return status


@nb.njit(cache=True, nogil=True)
def _fill_queue(st, fd, sqe_flags, offs, lens, bufs, base, buf_index, qd, done, redo, nredo,
                nxt, inflight, sq_tail):
    """Queue reads until ``qd`` are in flight: resubmissions (``redo``) first, then the
    next runs; one SQE reads at most ``MAX_SQE_BYTES`` of a run (the rest comes back as a
    short read). Publishes the new tail. Returns ``(sq_tail, nxt, nredo, inflight)``."""
    n = offs.shape[0]
    queued = 0
    while inflight < qd and (nredo > 0 or nxt < n):
        if nredo > 0:
            nredo -= 1
            i = redo[nredo]
        else:
            i = nxt
            nxt += 1
        d = done[i]
        _push_read(st, sq_tail, fd, sqe_flags, offs[i] + d,
                   min(lens[i] - d, MAX_SQE_BYTES), base + bufs[i] + d, buf_index, i)
        sq_tail = (sq_tail + 1) & 0xFFFFFFFF
        inflight += 1
        queued += 1
    if queued:
        _st_rel_u32(st[S_SQ_TAIL], sq_tail)
    return sq_tail, nxt, nredo, inflight


@nb.njit(cache=True, nogil=True)
def _reap(st, lens, done, redo, nredo, cq_head, inflight, failed, status, err):
    """Take every completion in the ring: a whole read finishes its run; a short read,
    ``-EAGAIN`` or ``-EINTR`` is queued for resubmission (unless a read failed); the first
    failure sets ``READ_FAILED`` and ``err``. Publishes the new head. Returns ``(cq_head,
    inflight, nredo, failed, status)``."""
    cq_mask = st[S_CQ_MASK]
    cqes = st[S_CQES]
    cq_tail = _ld_acq_u32(st[S_CQ_TAIL])
    while cq_head != cq_tail:
        cqe = cqes + (cq_head & cq_mask) * CQE_BYTES
        i = _ld_u64(cqe)
        res = _ld_i32(cqe + 8)
        cq_head = (cq_head + 1) & 0xFFFFFFFF
        inflight -= 1
        want = lens[i] - done[i]
        if res == want:
            done[i] = lens[i]
            continue
        retry = res == -EAGAIN or res == -EINTR
        if 0 < res < want:
            done[i] += res
            retry = True
        if retry:
            if not failed:
                redo[nredo] = i
                nredo += 1
            continue
        if not failed:
            failed = True
            status = READ_FAILED
            err[0] = i
            err[1] = done[i]
            err[2] = res
    _st_rel_u32(st[S_CQ_HEAD], cq_head)
    return cq_head, inflight, nredo, failed, status


@nb.njit(cache=True, nogil=True)
def ring_backlog(st):
    """(SQEs queued but not taken by the kernel, CQEs posted but not reaped)."""
    sq = (st[S_SQ_TAIL_LOCAL] - _ld_acq_u32(st[S_SQ_HEAD])) & 0xFFFFFFFF
    cq = (_ld_acq_u32(st[S_CQ_TAIL]) - _ld_u32(st[S_CQ_HEAD])) & 0xFFFFFFFF
    return sq, cq
