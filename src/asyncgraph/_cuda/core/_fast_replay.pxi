# Graph replays on the compiled fast path (included by _core_compiled.pyx after _fast_plan.pxi,
# before _fast.pxi): FastPath.route, the routed replays within FastPath.dispatch, FastPath.replay.
#
# A plan the graph cache routed (FastPath.route) keeps its graphs in a ReplayRoute. A
# graph="always" dispatch of it, or a graph="auto" one whose signature chose graphs (or
# measures a replay now), takes a free graph (CachedGraph.take_fast: its turn, its scalars
# unchanged), writes the inputs into the graph's pinned block, launches the graph and records
# the event, all in C within FastPath.dispatch; FastPath._complete reads the results out of the
# graph's pinned output block and lets the graph go (replay_done). FastPath.replay launches a
# graph its owner readied (a captured graph's, a recorded one's: ``ReplayedGraph``) the same
# way, after the unfinished uses of its resident buffers; its results are the graph's own
# (``results``). Anything else declines, having changed nothing. A route counts the replays of
# "auto"'s choice of graphs and tells the choice every REPLAYS_TOLD_EVERY (``Choice.replayed``).

from functools import partial as _partial

from asyncgraph.capture._choice import ChoiceState as _ChoiceState
from asyncgraph.capture._choice import REPLAYS_TOLD_EVERY as _TOLD_EVERY_
from ._watches import OWN_END as _OWN_END

cdef object _ALWAYS = "always"
cdef object _CHOSE_GRAPH = _ChoiceState.GRAPH
cdef Py_ssize_t _TOLD_EVERY = _TOLD_EVERY_


cdef class ReplayRoute:
    """The cached graphs of one signature that its ``graph="always"``/``"auto"`` dispatches
    replay here (a plan's ``route``): the graph cache's instances of it (its own list),
    ``"auto"``'s choice for it, if any, and ``expected``: a replay's time to completion, as
    learned here."""

    cdef public list instances
    cdef public object choice
    cdef public tuple scalars
    cdef public object hit
    cdef public double expected
    cdef public Py_ssize_t uncounted

    def __init__(self, list instances, choice, tuple scalars, hit):
        self.instances = instances
        self.choice = choice
        self.scalars = scalars
        self.hit = hit
        self.expected = 0.0
        self.uncounted = 0


cdef bint _route(FastPath fp, object call, list instances, object choice, object hit) except -1:
    """``FastPath.route``: the plan describing *call* (nothing resident) replays *instances*."""
    cdef CPlan plan
    cdef ReplayRoute route
    cdef Py_ssize_t i
    found = fp._kernels.get(call.kernel)
    if found is None:
        return False
    for candidate in (<KnownKernel>found).plans:
        plan = <CPlan>candidate
        if plan.n_residents or not _describes(plan.plan, call):
            continue
        route = <ReplayRoute>plan.route if plan.route is not None else None
        if route is None or route.instances is not instances:
            scalars = tuple([i for i in range(plan.n_args) if plan.args[i].kind == A_SCALAR])
            route = ReplayRoute(instances, None, scalars, hit)
            plan.route = route
        route.choice = choice or route.choice
        return True
    return False


cdef Py_ssize_t _least_busy(FastPath fp, int rank=_NORMAL) except -2:
    """The least busy of the stream pool's lanes not leased, ties in turn from the cursor (as
    StreamPool.pick); -1 if every lane is leased. Of another class than the default one
    (*rank*): the least busy of that class's lanes, the first of those tied (as
    ``Device.placed``)."""
    cdef Py_ssize_t k, i, lane_index = -1, count = fp._n_lanes, start = fp._cursor
    cdef Py_ssize_t out, best_out = 0
    if rank != _NORMAL:
        for i in range(count):
            if fp._lane[i].rank != rank:
                continue
            out = fp._slots[i].outstanding
            if lane_index < 0 or out < best_out:
                lane_index = i
                best_out = out
        return lane_index
    count = fp._n_pool
    for k in range(count):
        i = (start + k) % count
        slot = fp._slots[i]
        if slot.leased:
            continue
        out = slot.outstanding
        if out == 0:
            return i
        if lane_index < 0 or out < best_out:
            lane_index = i
            best_out = out
    return lane_index


cdef object _replay_routed(
    FastPath fp, CPlan plan, tuple args, object graph, double t0, object loop
):
    """Replay a free graph of *plan*'s route for *args*: its pending result, or ``None``
    having changed nothing (see the file's head)."""
    cdef ReplayRoute route = <ReplayRoute>plan.route
    cdef Py_ssize_t lane_index
    cdef FastJob job
    cdef object sampled = None, layout = None, cached = None, choice, counted = None
    if graph != _ALWAYS:
        choice = route.choice
        if choice is None:
            return None
        if choice.state is not _CHOSE_GRAPH:
            if choice.eager or not choice.sampling:
                return None  # "auto" runs eagerly now, or was forgotten
            sampled = choice  # a replay "auto" measures, as its replays would run
        else:
            counted = choice  # a choice of graphs, told its replays in bulk
    lane_index = _least_busy(fp)
    if lane_index < 0:
        return None  # every lane leased
    for cached in route.instances:
        layout = cached.take_fast(args, route.scalars)
        if layout is not None:
            break
    if layout is None:
        return None  # every graph busy, or a scalar changed: the general path
    exec_at, in_at, out_at = layout
    # -- from here on, the replay happens: all of it, or nothing if a step raises -------------
    job = FastJob.__new__(FastJob)
    job.cplan = plan
    job.call = plan.template
    job.args = args
    job.lane = fp._lanes[lane_index]
    job.lane_index = lane_index
    job.priority = _NORMAL
    job.t_dispatch = job.started = t0
    job.choice = sampled
    job.graph = cached
    job.out_at = <uint64_t>out_at
    job.buffers = _EMPTY
    try:
        job.id = next(fp._ids)
        job.pending = pending = new_pending(loop, job.id, plan.name, fp._spin_own)
        _admit(fp, job, True, None, None)
    except BaseException:
        cached.replay_done()
        raise
    _launch_watched(fp, job, cached, <uint64_t>exec_at, lane_index, route.expected, plan, args,
                    <uint64_t>in_at)
    route.hit()
    if counted is not None:
        route.uncounted += 1
        if route.uncounted >= _TOLD_EVERY:
            route.uncounted = 0
            counted.replayed(_TOLD_EVERY)
    return pending


cdef object _replay_graph(
    FastPath fp, object graph, object call, object buffers, tuple writes, object choice,
    double started,
):
    """``FastPath.replay``: launch *graph* (readied for *call* by its owner) after the
    unfinished uses of *buffers* (written where *writes* says); its pending result, or
    ``None`` having changed nothing when this is not the steady state."""
    cdef double t0 = _now()
    cdef Py_ssize_t lane_index
    cdef bint placed
    cdef FastJob job
    cdef list uses = list(buffers) if buffers else None
    loop = _steady_loop(fp)
    if loop is None:
        return None
    lane_index = _lane_after(fp, uses, writes, _NORMAL) if uses is not None else -1
    if lane_index == -2:
        return None  # the general path orders them
    placed = lane_index < 0
    if placed:
        lane_index = _least_busy(fp)
        if lane_index < 0:
            return None  # every lane leased
    exec_at = graph.launch_address()
    # -- from here on, the replay happens: all of it, or nothing if a step raises -------------
    job = FastJob.__new__(FastJob)
    job.cplan = None
    job.call = call
    job.args = _EMPTY
    job.lane = fp._lanes[lane_index]
    job.lane_index = lane_index
    job.priority = _NORMAL
    job.t_dispatch = t0
    job.started = started if started > 0.0 else t0
    job.choice = choice
    job.graph = graph
    job.buffers = uses if uses is not None else _EMPTY
    job.id = next(fp._ids)
    job.pending = pending = new_pending(loop, job.id, call.kernel.name, fp._spin_own)
    _admit(fp, job, placed, uses, writes)  # if it raises, the caller lets the graph go
    _launch_watched(fp, job, graph, <uint64_t>exec_at, lane_index, graph.expected, None, _EMPTY, 0)
    return pending


cdef inline object _steady_loop(FastPath fp):
    """The backend's loop if a launch may go on the fast path
    now (open and called on its loop, a reactor listening, no fault, no capture pausing it,
    nothing queued and an in-flight slot free); else ``None``."""
    cdef Watches watches = fp._watches
    life = fp._life
    if life.state != _OPEN:
        return None
    loop = life.loop
    if loop is None or not _runs_here(fp, loop):
        return None
    if (
        watches.schedule is None
        or watches.fault is not None
        or watches.paused
        or len(fp._door.queue)
        or len(fp._door.in_flight) >= fp._door.limit
    ):
        return None
    return loop


cdef int _admit(FastPath fp, FastJob job, bint placed, list uses, tuple writes) except -1:
    """Admit *job*, launched on its lane, through the scheduler's door: the lane's slot (and
    its placements, if *placed* there) count it, the uses of the resident
    buffers *uses* (written where *writes* says) are recorded, the cursor moves on past a
    placed lane; if a step raises, all of it is taken back. A lane of another class than the
    default one is no placement of the stream pool's (as on the general path)."""
    cdef int taken = 0
    slot = fp._slots[job.lane_index]
    placed = placed and job.priority == _NORMAL
    try:
        fp._door.admit_launched(job)
        slot.outstanding += 1
        taken = 1
        if placed:
            fp.placements += 1  # the stream pool's statistics count them too
            taken = 2
        if uses is not None:
            track_uses(uses, writes, job)  # ordered by the lane (checked before)
    except BaseException:
        fp._door.withdraw(job)
        if taken:
            slot.outstanding -= 1
        if taken > 1:
            fp.placements -= 1
        raise
    if placed:
        fp._cursor = (fp._cursor + 1) % fp._n_pool  # over the pool's lanes alone
    fp.dispatches += 1
    return 0


cdef Py_ssize_t _lane_after(FastPath fp, list buffers, tuple writes, int rank) except -3:
    """The lane every unfinished use of *buffers* runs on, by
    index; -1 for none; -2 when the general path must order them (a buffer closed or passed
    twice, a use not launched yet, a download, uses on two lanes, that lane leased, or of
    another class than *rank*'s: across classes the general path orders by an event)."""
    cdef Py_ssize_t i, k, n = len(buffers)
    cdef PyObject* lane = NULL  # borrowed: every lane is the backend's, held by fp._lanes
    cdef object buffer
    for i in range(n):
        buffer = buffers[i]
        if not fp._store.is_live(buffer):
            return -2
        for k in range(i):
            if buffers[k] is buffer:
                return -2
        if _join(&lane, writer_of(buffer)):
            return -2
        if writes[i]:
            for dep in readers_of(buffer):
                if _join(&lane, dep):
                    return -2
    if lane == NULL:
        return -1
    i = (<object>lane).index
    if i >= fp._n_lanes or fp._lane[i].rank != rank:
        return -2
    if rank == _NORMAL and fp._slots[i].leased:  # the other classes' lanes are reserved
        return -2
    return i


cdef inline bint _join(PyObject** lane, object use) except -1:
    """Take the lane of a buffer's unfinished *use* into *lane* (the lane so far, or NULL):
    true when the fast path cannot order after it (``_lane_of``'s ``_ELSEWHERE``, or a use on
    another lane than *lane*)."""
    cdef object dep_lane = _lane_of(use)
    if dep_lane is None:
        return False
    if dep_lane is _ELSEWHERE:
        return True
    if lane[0] == NULL:
        lane[0] = <PyObject*>dep_lane  # borrowed: a lane of the backend's (fp._lanes)
        return False
    return lane[0] != <PyObject*>dep_lane


cdef int _launch_watched(
    FastPath fp, FastJob job, object graph, uint64_t exec_at, Py_ssize_t lane_index,
    double expected, CPlan plan, tuple args, uint64_t in_at,
) except -1:
    """Write *args*' staged inputs into the pinned block at *in_at* (where *plan* stages any),
    launch the graph at *exec_at* on the lane, record the job's event and have the reactor
    watch it, expecting the replay's *expected* seconds; a launch that fails is the job's
    failure (its completion reports it), an event that cannot be recorded finishes it the
    general way (``_not_watched``)."""
    cdef Watches watches = fp._watches
    cdef LaneC* lc = &fp._lane[lane_index]
    cdef Py_ssize_t i
    cdef ArgC* a
    cdef cnp.ndarray arr
    cdef uint8_t* host
    cdef int code
    cdef object value
    cdef cydriver.CUcontext own = <cydriver.CUcontext>watches.context, current = NULL
    cdef bint pushed = False
    if own != NULL:
        cydriver.cuCtxGetCurrent(&current)
        pushed = current != own and cydriver.cuCtxPushCurrent(own) == 0
    try:
        if plan is not None and plan.has_uploads:
            host = <uint8_t*><uintptr_t>in_at
            for i in range(plan.n_args):
                a = &plan.args[i]
                if a.nbytes:
                    value = args[i]
                    arr = <cnp.ndarray>(value.array if a.kind == A_IN_OUT else value)
                    memcpy(host + a.offset, cnp.PyArray_DATA(arr), a.nbytes)
            fp.bytes_up += plan.up_end
            fp.copies_up += 1
        code = <int>cydriver.cuGraphLaunch(<cydriver.CUgraphExec><uintptr_t>exec_at, lc.handle)
        if code != 0:
            job.failure = _error_for(code, "cuGraphLaunch")  # its completion reports it
        else:
            graph.replays += 1
            fp.replays += 1
        idle = fp._idle_events
        event = idle.pop() if idle else fp._take_event()
        job._event = event
        job.ev = <cydriver.CUevent>_address(event)
        code = <int>cydriver.cuEventRecord(job.ev, lc.handle)
        if code != 0:
            idle.append(event)
            job._event = None
            raise _error_for(code, "cuEventRecord")
    except BaseException as exc:
        fp._not_watched(job, exc)
        if not isinstance(exc, Exception):
            raise
        return 0
    finally:
        if pushed:
            cydriver.cuCtxPopCurrent(&current)
    watches.seq += 1
    job.seq = watches.seq
    if expected > 0.0:
        job.expect = job.t_dispatch + expected
    (<WatchLane>watches.lanes[lane_index]).pending.append(job)
    watches.pending += 1
    if not watches.poll_scheduled:
        watches._request_poll()
    fp._submitted[job.priority] += 1
    _record_value(&fp._submit_time, _now() - job.t_dispatch)
    return 0


cdef int _replay_ended(FastJob job, bint completed) except -1:
    """A replay ended: the graph free for its next replay, and, if it *completed*, its time
    learned (to when a waiter saw it end, if one did): the route's, or the graph's own."""
    cdef ReplayRoute route
    graph = job.graph
    graph.replay_done()
    if not completed:
        return 0
    took = (job.seen if job.seen > 0.0 else _now()) - job.t_dispatch
    if job.cplan is None:
        graph.expected = _learned(graph.expected, took)
    elif job.cplan.route is not None:
        route = <ReplayRoute>job.cplan.route
        route.expected = _learned(route.expected, took)
    return 0


def _spin_own_end(Watches watches):
    """The spin a replay's pending result asks for: until the watch's own expected end."""
    return _partial(watches.spin, _OWN_END)
