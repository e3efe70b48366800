# cython: language_level=3, boundscheck=False, wraparound=False, initializedcheck=False
"""The dispatch core, compiled against ``cuda.bindings.cydriver``.

Its ``__all__`` is the leaf that talks to the driver, twinned by the Python core
(``_core_python`` and the modules it gathers; read their docstrings for the contract), one
shape each: the same :class:`Launcher`, :func:`record` and :func:`query` (a launch returns the
driver's code, a record or query the one-element tuple ``cuda.bindings`` returns), the reactor's
hot half (:class:`Watches`, ``_watches.pxi``), and :class:`NativeWaiter` (``_waiters.pxi``),
which only exists here. Beside the leaf it holds the fast path (:class:`FastPath`,
``_fast.pxi``), which has no twin: the Python core runs the general path.
The driver is called straight from C, with no Python objects built for the call's arguments.

:class:`NativeWaiter` runs one POSIX thread per lane. Each follows the event it was handed
(queries between short sleeps), with no Python thread state at all, and then writes to an
eventfd the event loop watches (``loop.add_reader``): the loop wakes in its selector, and a
completion never waits for the GIL to reach the loop.
"""

from libc.stdint cimport int8_t, int16_t, int32_t, int64_t, uint8_t, uint16_t, uint32_t, uint64_t, uintptr_t
from libc.stdlib cimport calloc, free, malloc
from libc.string cimport memcmp, memcpy, memset
from libc.errno cimport errno
from posix.unistd cimport read, write, close
from posix.time cimport clock_gettime, timespec, CLOCK_MONOTONIC
from cpython.object cimport PyObject
from cpython.ref cimport Py_INCREF

cimport numpy as cnp
from cuda.bindings cimport cydriver

cnp.import_array()

COMPILED = True

__all__ = (
    "COMPILED",
    "Launcher",
    "NativeWaiter",
    "Watch",
    "WatchLane",
    "Watches",
    "capture_tail",
    "query",
    "record",
)

# How a parameter's slot is written: a pointer, or a value of one of these numpy types.
cdef enum Kind:
    K_POINTER
    K_BOOL
    K_INT8
    K_INT16
    K_INT32
    K_INT64
    K_UINT8
    K_UINT16
    K_UINT32
    K_UINT64
    K_FLOAT32
    K_FLOAT64

_KINDS = {
    "b1": K_BOOL,
    "i1": K_INT8,
    "i2": K_INT16,
    "i4": K_INT32,
    "i8": K_INT64,
    "u1": K_UINT8,
    "u2": K_UINT16,
    "u4": K_UINT32,
    "u8": K_UINT64,
    "f4": K_FLOAT32,
    "f8": K_FLOAT64,
}


cdef inline uintptr_t _address(object handle) except? 0:
    """The address a ``cuda.bindings`` handle (or an int) stands for."""
    return <uintptr_t>int(handle)


cdef class Launcher:
    """A loaded kernel's ``CUfunction`` and its parameter block, packed and launched in C.

    Args:
        function: the ``CUfunction`` (a ``cuda.bindings`` handle), kept alive here.
        params: the kernel's parameters (``supports`` them).
    """

    def __cinit__(self, function, params):
        cdef Py_ssize_t n = len(params)
        cdef Py_ssize_t i
        cdef Py_ssize_t room = n if n > 0 else 1
        self._n = n
        self._slots = <uint8_t*>calloc(room, 16)
        self._params = <void**>calloc(room, sizeof(void*))
        self._kinds = <int*>calloc(room, sizeof(int))
        if self._slots == NULL or self._params == NULL or self._kinds == NULL:
            raise MemoryError("no memory for a kernel's parameter block")
        for i in range(n):
            param = params[i]
            self._params[i] = self._slots + 16 * i
            if param.pointer:
                self._kinds[i] = K_POINTER
            else:
                kind = _KINDS.get(param.dtype.str[1:]) if param.dtype is not None else None
                if kind is None:
                    raise TypeError(f"cannot pack a parameter of C type {param.ctype!r}")
                self._kinds[i] = kind
        self.function = function
        self._function = <cydriver.CUfunction>_address(function)

    def __dealloc__(self):
        free(self._slots)
        free(self._params)
        free(self._kinds)

    @staticmethod
    def supports(params):
        """Whether a launcher can pack *params*: pointers and the numpy types of ``_KINDS``
        (the Python launcher packs any dtype of at most 16 bytes)."""
        return all(
            p.pointer or (p.dtype is not None and p.dtype.str[1:] in _KINDS) for p in params
        )

    cdef int _put(self, Py_ssize_t i, object value) except -1:
        cdef uint8_t* slot = self._slots + 16 * i
        cdef int kind = self._kinds[i]
        if kind == K_POINTER or kind == K_UINT64:
            (<uint64_t*>slot)[0] = <uint64_t>value
        elif kind == K_FLOAT32:
            (<float*>slot)[0] = <float><double>value
        elif kind == K_FLOAT64:
            (<double*>slot)[0] = <double>value
        elif kind == K_INT32:
            (<int32_t*>slot)[0] = <int32_t>value
        elif kind == K_INT64:
            (<int64_t*>slot)[0] = <int64_t>value
        elif kind == K_UINT32:
            (<uint32_t*>slot)[0] = <uint32_t>value
        elif kind == K_INT16:
            (<int16_t*>slot)[0] = <int16_t>value
        elif kind == K_UINT16:
            (<uint16_t*>slot)[0] = <uint16_t>value
        elif kind == K_INT8:
            (<int8_t*>slot)[0] = <int8_t>value
        elif kind == K_UINT8:
            (<uint8_t*>slot)[0] = <uint8_t>value
        else:  # K_BOOL
            (<uint8_t*>slot)[0] = 1 if value else 0
        return 0

    cdef int _pack(self, args, uint64_t base) except -1:
        cdef Py_ssize_t i = 0
        for arg in args:
            if i >= self._n:
                raise ValueError(f"{len(args)} arguments for {self._n} parameters")
            if arg.by_value:
                self._put(i, arg.value)
            else:
                (<uint64_t*>(self._slots + 16 * i))[0] = base + <uint64_t>arg.offset
            i += 1
        if i != self._n:
            raise ValueError(f"{i} arguments for {self._n} parameters")
        return 0

    cdef int _pack_values(self, values) except -1:
        cdef Py_ssize_t i
        if len(values) != self._n:
            raise ValueError(f"{len(values)} arguments for {self._n} parameters")
        for i in range(self._n):
            self._put(i, values[i])
        return 0

    def pack(self, args, uint64_t base):
        """Write *args* (a call's bound arguments; staged arrays lie at *base* + their
        offset) into the parameter block."""
        self._pack(args, base)

    def pack_values(self, values):
        """Write each argument's launch value (scalars, and pointers as ints)."""
        self._pack_values(values)

    def packed(self):
        """The parameter block's bytes, 16 per parameter."""
        return (<char*>self._slots)[: 16 * self._n]

    def launch(self, args, uint64_t base, tuple grid, tuple block, unsigned int shared_mem, stream):
        """:meth:`pack` *args* and launch on *stream*; the driver's code."""
        self._pack(args, base)
        return self._go(grid, block, shared_mem, stream)

    def launch_values(self, values, tuple grid, tuple block, unsigned int shared_mem, stream):
        """:meth:`pack_values` and launch on *stream*; the driver's code."""
        self._pack_values(values)
        return self._go(grid, block, shared_mem, stream)

    def set_node(
        self, graph_exec, node, values, tuple grid, tuple block, unsigned int shared_mem,
        size_t context,
    ):
        """:meth:`pack_values` into the kernel *node* (its handle in the graph) of the
        executable graph *graph_exec*, in one ``cuGraphExecKernelNodeSetParams``, with the
        context at address *context* current (0: whichever is); the driver's code."""
        cdef cydriver.CUDA_KERNEL_NODE_PARAMS params
        cdef cydriver.CUcontext own = <cydriver.CUcontext>context, current = NULL
        cdef cydriver.CUgraphExec exec_handle = <cydriver.CUgraphExec>_address(graph_exec)
        cdef cydriver.CUgraphNode node_handle = <cydriver.CUgraphNode>_address(node)
        cdef cydriver.CUresult code
        cdef bint pushed = False
        self._pack_values(values)
        memset(&params, 0, sizeof(params))
        params.func = self._function
        params.gridDimX, params.gridDimY, params.gridDimZ = grid[0], grid[1], grid[2]
        params.blockDimX, params.blockDimY, params.blockDimZ = block[0], block[1], block[2]
        params.sharedMemBytes = shared_mem
        params.kernelParams = self._params
        params.ctx = own
        if own != NULL:
            cydriver.cuCtxGetCurrent(&current)
            pushed = current != own and cydriver.cuCtxPushCurrent(own) == cydriver.CUDA_SUCCESS
        code = cydriver.cuGraphExecKernelNodeSetParams(exec_handle, node_handle, &params)
        if pushed:
            cydriver.cuCtxPopCurrent(&current)
        return <int>code

    cdef int _go(self, tuple grid, tuple block, unsigned int shared_mem, stream) except? -1:
        cdef unsigned int gx = grid[0], gy = grid[1], gz = grid[2]
        cdef unsigned int bx = block[0], by = block[1], bz = block[2]
        cdef cydriver.CUstream handle = <cydriver.CUstream>_address(stream)
        cdef cydriver.CUresult code
        with nogil:
            code = cydriver.cuLaunchKernel(
                self._function, gx, gy, gz, bx, by, bz, shared_mem, handle, self._params, NULL
            )
        return <int>code


def record(event, stream):
    """``cuEventRecord(event, stream)``; ``(code,)``, as ``cuda.bindings`` returns it."""
    return (<int>cydriver.cuEventRecord(
        <cydriver.CUevent>_address(event), <cydriver.CUstream>_address(stream)
    ),)


def capture_tail(stream):
    """``cuStreamGetCaptureInfo(stream)`` as a capture asks it: (the driver's code, the capture
    status, how many nodes the stream's next work would depend on, the first of them as an
    int, 0 if none)."""
    cdef cydriver.CUstreamCaptureStatus status = cydriver.CU_STREAM_CAPTURE_STATUS_NONE
    cdef const cydriver.CUgraphNode* deps = NULL
    cdef size_t count = 0
    cdef cydriver.CUresult code = cydriver.cuStreamGetCaptureInfo(
        <cydriver.CUstream>_address(stream), &status, NULL, NULL, &deps, NULL, &count
    )
    return (
        <int>code, <int>status, count, <uintptr_t>deps[0] if code == 0 and count else 0
    )


def query(event):
    """``cuEventQuery(event)``; ``(code,)`` (``NOT_READY`` while it runs)."""
    return (<int>cydriver.cuEventQuery(<cydriver.CUevent>_address(event)),)


include "_waiters.pxi"
include "_watches.pxi"
include "_fast_plan.pxi"
include "_fast_replay.pxi"
include "_fast.pxi"
