# The compiled dispatch core's classes, declared for every part of _core_compiled.pyx (its .pxi files
# use each other's C attributes and methods).

from libc.stdint cimport int64_t, uint8_t, uint64_t, uintptr_t
from cpython.object cimport PyObject

from cuda.bindings cimport cydriver

from asyncgraph._buffers._resident cimport ResidentStore
from asyncgraph._jobs._fast_door cimport FastDoor


cdef class Launcher:
    cdef cydriver.CUfunction _function
    cdef Py_ssize_t _n
    cdef uint8_t* _slots
    cdef void** _params
    cdef int* _kinds
    cdef readonly object function

    cdef int _put(self, Py_ssize_t i, object value) except -1
    cdef int _pack(self, args, uint64_t base) except -1
    cdef int _pack_values(self, values) except -1
    cdef int _go(self, tuple grid, tuple block, unsigned int shared_mem, stream) except? -1


cdef class WatchItem:
    cdef public long long seq
    cdef public object callback
    cdef public bint held
    cdef public bint finished
    cdef public double expect  # when its work is expected to end (perf_counter()); 0.0: unknown
    cdef public double seen  # when a waiter thread saw it complete (perf_counter()); 0.0: none
    cdef object _event
    cdef cydriver.CUevent ev


cdef class Watch(WatchItem):
    pass


cdef class WatchLane:
    cdef public int index
    cdef public object pending
    cdef public Py_ssize_t ready
    cdef public object handed
    cdef public object queue
    cdef public object thread
    cdef public object last_code
    cdef public double done_at  # when the waiter saw its last event complete (perf_counter())


cdef class Watches:
    cdef public list lanes
    cdef public list idle_events
    cdef public double spin_window
    cdef public Py_ssize_t pending
    cdef public long long seq
    cdef public bint poll_scheduled
    cdef public double poll_asked
    cdef public double window_start
    cdef public double held_since
    cdef public long long spins
    cdef public bint paused
    cdef public object fault
    cdef readonly object schedule
    cdef readonly object failed
    cdef readonly object complete
    cdef readonly size_t context  # the backend's CUcontext, made current around spin(); 0: none
    cdef FastPath fast
    cdef char* _running
    cdef char* _checked
    cdef Py_ssize_t _n

    cdef int _request_poll(self) except -1
    cdef int _spin_lone(self, double now, double held, double until) except -1
    cdef int _finish(self, WatchItem watch, object error) except -1
    cdef int _call(self, WatchItem watch, object error) except -1


cdef class FastJob(WatchItem):
    cdef public object args
    cdef public object buffers
    cdef public object call
    cdef public object device_time
    cdef public object failure
    cdef public bint gpu_done
    cdef public object id
    cdef public object lane
    cdef public object outcome
    cdef public object pending
    cdef public object state
    cdef public double t_dispatch
    cdef public long long ring_start
    cdef public long long ring_end
    cdef public object choice  # graph="auto"'s choice, told its cost when it completes
    cdef public object graph  # the graph a replay launches (None: an eager dispatch)
    cdef public double started  # where "auto"'s measure of a replay counts from (0.0: t_dispatch)
    cdef uint64_t out_at  # a replay's results: its graph's pinned output block less in_end
    cdef CPlan cplan
    cdef int lane_index
    cdef public int priority  # its class's rank (runtime/_priority), as a Job's


cdef struct ArgC:
    int kind
    PyObject* type      # the exact type (held by CPlan.keep)
    PyObject* dtype     # arrays, Outs, buffers: the dtype compared by identity (held)
    PyObject* shape     # an Out's shape tuple (held)
    int ndim
    Py_ssize_t dims[8]
    Py_ssize_t strides[8]
    Py_ssize_t offset
    Py_ssize_t nbytes
    int write           # a resident buffer the kernel writes


cdef struct ResultC:
    int kind
    Py_ssize_t index
    Py_ssize_t offset
    Py_ssize_t nbytes
    PyObject* dtype     # held
    int type_num
    int ndim
    Py_ssize_t dims[8]


cdef class CPlan:
    cdef object plan           # the FastPlan it was made from
    cdef list keep             # what the borrowed pointers below point to
    cdef object template
    cdef object name
    cdef object grid_key
    cdef object block_key
    cdef unsigned int grid[3]
    cdef unsigned int block[3]
    cdef unsigned int shared_mem
    cdef Py_ssize_t n_args
    cdef ArgC* args
    cdef Py_ssize_t n_returned
    cdef ResultC* returned
    cdef Py_ssize_t n_residents
    cdef Py_ssize_t* residents  # the argument index of each resident buffer
    cdef tuple writes  # whether the kernel writes each resident buffer (track_uses)
    cdef bint has_uploads
    cdef uint64_t in_end
    cdef uint64_t up_end
    cdef uint64_t up_copy  # bytes of the upload: up_end, or total with the outputs zeroed
    cdef uint64_t total
    cdef uint64_t staged
    cdef double expected  # seconds from dispatch to completion, learned (_watches.learned)
    cdef object auto  # what graph="auto" chose for it (FastPath.steer), or None
    cdef object route  # the cached graphs its dispatches replay (a ReplayRoute), or None

    cdef PyObject* _hold(self, value)


cdef class KnownKernel:
    cdef public Launcher launcher
    cdef public list plans
    cdef public bint steered  # graph="auto" steered one of its plans


cdef struct LaneC:
    cydriver.CUstream handle
    uint64_t scratch
    uint8_t* ring
    uint64_t head
    uint64_t tail
    int rank            # the priority class whose work runs on it (Lane.rank)


cdef enum:
    N_CLASSES = 3  # the priority classes (runtime/_priority.PRIORITIES; checked at import)


cdef struct HistogramC:
    int64_t count
    double total
    double low
    double high
    int64_t counts[201]


cdef class FastPath:
    cdef object _here  # what asyncio kept for this thread when it said the loop ran here
    cdef long _here_forks
    cdef list _lanes
    cdef list _slots
    cdef list _rings
    cdef LaneC* _lane
    cdef Py_ssize_t _n_lanes
    cdef Py_ssize_t _n_pool  # the stream pool's lanes, the first ones (the default class's)
    cdef Py_ssize_t _cursor  # where ties among them start, in turn
    cdef Watches _watches
    cdef object _spin
    cdef object _spin_own  # a replay's spin: until the watch's own expected end
    cdef list _idle_events
    cdef object _take_event
    cdef object _pool
    cdef FastDoor _door  # the scheduler's: its transitions, and the containers they change
    cdef object _life
    cdef object _dispatcher
    cdef ResidentStore _store
    cdef object _ids
    cdef dict _kernels
    cdef dict _launchers  # the device's loaded kernels' launchers (Launches.launchers)
    cdef public long long dispatches
    cdef public long long completed
    cdef public long long failed
    cdef public long long bytes_up
    cdef public long long bytes_down
    cdef public long long copies_up
    cdef public long long copies_down
    cdef public long long replays  # of cached graphs (_fast_replay.pxi)
    cdef public long long placements  # dispatches it placed on the least busy lane itself
    cdef long long _submitted[N_CLASSES]  # dispatches since the last flush, by class: none waited
    cdef HistogramC _submit_time
    cdef HistogramC _latency[N_CLASSES]  # by class (PRIORITIES order)

    cdef int _enqueue(
        self, FastJob job, CPlan plan, Launcher launcher, tuple args, LaneC* lc, uint64_t at
    ) except -1
    cdef int _complete(self, FastJob job, object error) except -1
    cdef object _results(self, FastJob job)
    cdef int _not_watched(self, FastJob job, object error) except -1
