# The fast path (included by _core_compiled.pyx after _fast_plan.pxi). It has no twin: where the
# compiled core does not run, every dispatch takes the general path, which is its semantic
# reference (docs/core.md). The same guards, commit, enqueue and completion as the general
# path's, in the same order; here the plan is a C array per argument, an array's guard and
# staging read numpy's C API, the parameter block is written in place, every driver call is
# made from C, and the counters and histograms are C fields added into the backend's telemetry
# on each sync.


cdef class FastPath:
    """The steady state of a CUDA backend's dispatches, in one call (``docs/core.md``, "The
    fast path": its arguments, methods and behaviour)."""

    def __cinit__(self, lanes, rings, watches, events, stream_pool, front, launchers, launcher_type):
        cdef Py_ssize_t n = len(lanes)
        self._here_forks = -1  # nothing kept yet (_runs_here)
        self._lane = <LaneC*>calloc(n if n else 1, sizeof(LaneC))
        if self._lane == NULL:
            raise MemoryError("no memory for the fast path's lanes")

    def __init__(
        self, lanes, rings, Watches watches, events, stream_pool, front, dict launchers,
        launcher_type,
    ):
        cdef Py_ssize_t i
        if launcher_type is not Launcher:
            raise TypeError("the compiled fast path packs the compiled core's launchers only")
        self._lanes = list(lanes)
        self._slots = [lane.slot for lane in lanes]
        self._rings = list(rings)
        self._n_lanes = len(self._lanes)
        self._n_pool = len(stream_pool.lanes)  # the other classes' lanes come after them
        for i in range(self._n_lanes):
            lane = self._lanes[i]
            self._lane[i].handle = <cydriver.CUstream>_address(lane.handle)
            self._lane[i].scratch = lane.scratch_ptr
            self._lane[i].ring = <uint8_t*><uintptr_t>self._rings[i].ptr
            self._lane[i].head = 0
            self._lane[i].tail = 0
            self._lane[i].rank = lane.rank
        self._watches = watches
        self._spin = watches.spin
        self._spin_own = _spin_own_end(watches)  # a replay's: until its expected end
        self._idle_events = events.idle
        self._take_event = events.take
        self._pool = stream_pool
        self._door = front.door  # the scheduler's FastDoor
        self._life = front.lifecycle
        self._dispatcher = front.dispatcher
        self._store = front.store
        self._ids = front.ids
        self._kernels = {}
        self._launchers = launchers
        for i in range(N_CLASSES):
            self._submitted[i] = 0
            _clear(&self._latency[i])
        self.replays = 0
        _clear(&self._submit_time)
        watches.serve_fast(self)

    def __dealloc__(self):
        free(self._lane)

    # -- what it knows ---------------------------------------------------------------------

    def learn(self, plan, call):
        """A plan was made from *call*: launch later calls that fit it here, if it can."""
        if not _eligible(plan, call):
            return
        try:
            cplan = CPlan(_FastPlan(plan, call))
        except ValueError:
            return  # more dimensions than a plan here keeps: the general path runs it
        KnownKernel.of(self._kernels, call.kernel).learn(cplan)

    def steer(self, call, choice):
        """Let ``graph="auto"`` dispatches like *call* follow *choice*: the plans that launch
        its signature keep it, and take such dispatches while ``choice.eager`` holds."""
        cdef KnownKernel known
        cdef CPlan plan
        found = self._kernels.get(call.kernel)
        if found is None:
            return
        known = <KnownKernel>found
        for candidate in known.plans:
            if (<CPlan>candidate).auto is choice:
                return  # steered already
        for candidate in known.plans:
            plan = <CPlan>candidate
            if _describes(plan.plan, call):
                plan.auto = choice
                known.steered = True

    def replay(self, graph, call, buffers, writes, choice=None, double started=0.0):
        """Launch *graph*, ready to replay *call* on *buffers* (written where *writes* says),
        and return the pending result; ``None``, having changed nothing, when this is not the
        steady state. *choice*: a ``graph="auto"`` choice told the replay's cost from
        *started* once it completed."""
        return _replay_graph(self, graph, call, buffers, tuple(writes), choice, started)

    def route(self, call, list instances, choice, hit):
        """Replay *instances* (the graph cache's list of its graphs of *call*'s signature) for
        the calls that fit *call*'s plan, calling *hit* for each (the cache counts them);
        *choice*: ``"auto"``'s for the signature, or ``None``. Whether a plan had it (none is
        learned of calls with resident buffers)."""
        return _route(self, call, instances, choice, hit)

    def close(self):
        """Forget every kernel; the ring blocks to give back to the pinned pool."""
        self._kernels.clear()
        blocks, self._rings = self._rings, []
        self._n_lanes = self._n_pool = 0
        return blocks

    # -- the dispatch --------------------------------------------------------------------------

    def dispatch(self, kernel, tuple args, grid, block, shared_mem, timing, graph, int rank=_NORMAL):
        """Launch the call if it is the steady state; ``None`` (having changed nothing) if not.
        *rank*: its priority class's (``runtime/_priority``): it runs on a lane of that class;
        a graph's dispatch is the default class's only."""
        cdef double t0 = _now()
        cdef KnownKernel known
        cdef CPlan plan = None
        cdef Watches watches = self._watches
        cdef Py_ssize_t i, r, lane_index = -1
        cdef LaneC* lc
        cdef uint64_t start_at = 0, at = 0, staged
        cdef bint placed, auto
        cdef FastJob job
        cdef object loop, value, buffer, pending, choice
        cdef list uses = None
        found = self._kernels.get(kernel)
        if found is None:
            return None
        known = <KnownKernel>found
        if timing is not False:
            return None
        if known.launcher is None:  # loaded since it was learned, perhaps
            launcher = self._launchers.get(kernel)
            if type(launcher) is not Launcher:
                return None
            known.launcher = launcher
        auto = graph is not _NEVER and graph != _NEVER
        if auto and rank != _NORMAL:
            return None  # the general path: graphs serve the default class here
        if rank < 0 or rank >= N_CLASSES:
            return None
        if auto and (graph != _ALWAYS if graph != _AUTO else not known.steered):
            return None  # the general path checks the mode, or "auto" chose nothing here
        loop = _steady_loop(self)
        if loop is None:
            return None
        # The plan's guards: the same checks a Plan makes, with no bound argument built.
        for candidate in known.plans:
            if _fits(<CPlan>candidate, args, grid, block, shared_mem):
                plan = <CPlan>candidate
                break
        if plan is None:
            return None
        choice = plan.auto if auto else None
        if auto and (graph is _ALWAYS or graph == _ALWAYS or choice is None or not choice.eager):
            if plan.route is None:
                return None  # no graph of it cached yet: the general path records one
            return _replay_routed(self, plan, args, graph, t0, loop)
        # Resident buffers: live, and every unfinished use of them on one lane (or none).
        if plan.n_residents:
            uses = []
            for r in range(plan.n_residents):
                i = plan.residents[r]
                value = args[i]
                buffer = _into(value) if plan.args[i].kind == A_INTO else value
                if type(buffer) is not ResidentBuffer:
                    return None  # the general path checks what it is
                uses.append(buffer)
            lane_index = _lane_after(self, uses, plan.writes, rank)
            if lane_index == -2:
                return None  # stale, twice in one call, or uses elsewhere: the general way
        placed = lane_index < 0
        if placed:  # the least busy lane not leased, ties in turn (as StreamPool.pick)
            lane_index = _least_busy(self, rank)
            if lane_index < 0:
                return None  # every lane leased
        # Room in the lane's staging ring.
        lc = &self._lane[lane_index]
        staged = plan.staged
        start_at = lc.head
        if staged:
            at = start_at % _RING
            if at + staged > _RING:
                start_at += _RING - at
                at = 0
            if start_at + staged - lc.tail > _RING:
                return None  # the ring is full: the general path stages in the pinned pool
        # -- from here on, the dispatch happens: all of it, or nothing if a step raises ------
        job = FastJob.__new__(FastJob)
        job.cplan = plan
        job.call = plan.template
        job.args = args
        job.lane = self._lanes[lane_index]
        job.lane_index = lane_index
        job.priority = rank
        job.t_dispatch = t0
        if choice is not None and choice.sampling:
            job.choice = choice  # "auto" measures it
        job.id = next(self._ids)
        pending = new_pending(loop, job.id, plan.name, self._spin)
        job.pending = pending
        job.buffers = uses if plan.n_residents else _EMPTY
        _admit(self, job, placed, uses, plan.writes)
        if staged:
            lc.head = start_at + staged
            job.ring_start = start_at
            job.ring_end = start_at + staged
        # The backend's own context, current for the driver calls whatever the thread had.
        cdef cydriver.CUcontext own = <cydriver.CUcontext>watches.context, current = NULL
        cdef bint pushed = False
        if own != NULL:
            cydriver.cuCtxGetCurrent(&current)
            pushed = current != own and cydriver.cuCtxPushCurrent(own) == 0
        try:
            self._enqueue(job, plan, known.launcher, args, lc, at)
            idle = self._idle_events
            event = idle.pop() if idle else self._take_event()
            job._event = event
            job.ev = <cydriver.CUevent>_address(event)
            code = <int>cydriver.cuEventRecord(job.ev, lc.handle)
            if code != 0:
                idle.append(event)
                job._event = None
                raise _error_for(code, "cuEventRecord")
        except BaseException as exc:
            self._not_watched(job, exc)
            if not isinstance(exc, Exception):
                raise
            return pending
        finally:
            if pushed:
                cydriver.cuCtxPopCurrent(&current)
        watches.seq += 1
        job.seq = watches.seq
        if plan.expected > 0.0:
            job.expect = t0 + plan.expected
        (<WatchLane>watches.lanes[lane_index]).pending.append(job)
        watches.pending += 1
        if not watches.poll_scheduled:
            watches._request_poll()
        self._submitted[rank] += 1  # the whole call was its submission: it waited in no queue
        _record_value(&self._submit_time, _now() - t0)
        return pending

    cdef int _enqueue(
        self, FastJob job, CPlan plan, Launcher launcher, tuple args, LaneC* lc, uint64_t at
    ) except -1:
        """Stage *args* in the ring at *at* and enqueue the copies, the zeroing of the outputs,
        the kernel and the download on the lane; a driver call that fails is kept as the
        job's failure (its completion reports it)."""
        cdef cydriver.CUstream handle = lc.handle
        cdef uint64_t base = lc.scratch
        cdef uint8_t* host = lc.ring + at
        cdef cydriver.CUresult code = cydriver.CUDA_SUCCESS
        cdef Py_ssize_t i
        cdef ArgC* a
        cdef cnp.ndarray arr
        cdef uint8_t* slot
        cdef uint64_t pointer
        cdef object value
        call = "cuMemcpyHtoDAsync"
        if plan.has_uploads:
            for i in range(plan.n_args):
                a = &plan.args[i]
                if a.nbytes:
                    value = args[i]
                    arr = <cnp.ndarray>(value.array if a.kind == A_IN_OUT else value)
                    memcpy(host + a.offset, cnp.PyArray_DATA(arr), a.nbytes)
        if plan.up_copy:
            if plan.up_copy > plan.up_end:  # small outputs go up zeroed with the inputs
                memset(host + plan.up_end, 0, plan.up_copy - plan.up_end)
            code = cydriver.cuMemcpyHtoDAsync(
                <cydriver.CUdeviceptr>base, host, plan.up_copy, handle
            )
            if code == cydriver.CUDA_SUCCESS:
                self.bytes_up += plan.up_copy
                self.copies_up += 1
        if code == cydriver.CUDA_SUCCESS and plan.total > plan.up_copy:
            call = "cuMemsetD8Async"
            code = cydriver.cuMemsetD8Async(
                <cydriver.CUdeviceptr>(base + plan.up_copy), 0, plan.total - plan.up_copy, handle
            )
        if code == cydriver.CUDA_SUCCESS:
            for i in range(plan.n_args):
                a = &plan.args[i]
                slot = launcher._slots + 16 * i
                if a.kind == A_SCALAR:
                    cnp.PyArray_ScalarAsCtype(args[i], slot)
                elif a.kind <= A_OUT:
                    (<uint64_t*>slot)[0] = base + <uint64_t>a.offset
                elif a.kind == A_RESIDENT:
                    (<uint64_t*>slot)[0] = <uint64_t>int(storage_of(args[i]).handle)
                else:  # A_INTO: zeroed first
                    value = args[i]
                    pointer = <uint64_t>int(storage_of(_into(value)).handle)
                    if code == cydriver.CUDA_SUCCESS:
                        code = cydriver.cuMemsetD8Async(
                            <cydriver.CUdeviceptr>pointer, 0, <size_t>value.nbytes, handle
                        )
                    (<uint64_t*>slot)[0] = pointer
        if code == cydriver.CUDA_SUCCESS:
            call = "cuLaunchKernel"
            code = cydriver.cuLaunchKernel(
                launcher._function,
                plan.grid[0], plan.grid[1], plan.grid[2],
                plan.block[0], plan.block[1], plan.block[2],
                plan.shared_mem, handle, launcher._params, NULL,
            )
        if code == cydriver.CUDA_SUCCESS and plan.total > plan.in_end:
            call = "cuMemcpyDtoHAsync"
            code = cydriver.cuMemcpyDtoHAsync(
                host + plan.in_end,
                <cydriver.CUdeviceptr>(base + plan.in_end),
                plan.total - plan.in_end,
                handle,
            )
            if code == cydriver.CUDA_SUCCESS:
                self.bytes_down += plan.total - plan.in_end
                self.copies_down += 1
        if code != cydriver.CUDA_SUCCESS:
            if <int>code == _OOM:
                job.failure = _AllocationError(f"{call} failed: device out of memory")
            else:
                job.failure = _error_for(<int>code, call)
        return 0

    cdef int _not_watched(self, FastJob job, object error) except -1:
        """The job's event could not be recorded: nothing will complete it, and what it
        enqueued may still run. Wait for its lane (``Lane.settle``); then its ring region (the
        newest) is free again, else (the device failed) it stays taken. Finish the job with
        *error* the general way."""
        if job.lane.settle() and job.ring_end:
            self._lane[job.lane_index].head = job.ring_start
        slot = self._slots[job.lane_index]
        slot.outstanding -= 1
        job.gpu_done = True
        if job.graph is not None:
            _replay_ended(job, False)
        self._dispatcher.done(job, error, None)
        return 0

    # -- the completion ------------------------------------------------------------------------

    def complete(self, FastJob job, error):
        """*job*'s event completed (or the device failed with *error*); see
        ``_fast.FastPath.complete``."""
        self._complete(job, error)

    cdef int _complete(self, FastJob job, object error) except -1:
        cdef LaneC* lc
        cdef object outcome, life
        cdef double since
        job.gpu_done = True
        if job.failure is not None:
            error = job.failure
        if job.choice is not None and error is None:  # "auto" measures it, from its start
            since = job.started if job.started > 0.0 else job.t_dispatch
            job.choice.took(job.graph is None, _now() - since)
        if error is not None:
            outcome = error
        elif job.cplan is None:  # a graph's replay (FastPath.replay): the graph's results
            try:
                outcome = job.graph.results(job.call)
            except Exception as exc:
                outcome = exc  # whatever went wrong fails this replay, visibly
        elif job.cplan.n_returned:
            try:
                outcome = self._results(job)
            except Exception as exc:
                outcome = exc  # whatever went wrong fails this dispatch, visibly
        else:
            outcome = _EMPTY
        if job.ring_end and job.lane_index < self._n_lanes:
            lc = &self._lane[job.lane_index]
            if <uint64_t>job.ring_end > lc.tail:
                lc.tail = job.ring_end
        if job.graph is not None:  # a replay: its graph free for the next, its time learned
            _replay_ended(job, type(outcome) is tuple)
        slot = self._slots[job.lane_index]
        slot.outstanding -= 1
        life = self._life
        # Unless something waits for this slot, or for the backend to drain: the general way.
        if life.state != _OPEN or len(life.room.parked) or not self._door.complete_launched(
            job, outcome
        ):
            self._dispatcher.done(job, outcome, None)
            return 0
        for buffer in job.buffers:
            untrack(buffer, job)
        now = _now()
        _record_value(&self._latency[job.priority], now - job.t_dispatch)
        if isinstance(outcome, BaseException):
            self.failed += 1
        else:
            self.completed += 1
            if job.graph is None:  # a replay's time is its route's (_replay_ended)
                # The plan's time, learned, from when a waiter saw it end if one did.
                job.cplan.expected = _learned(
                    job.cplan.expected, (job.seen if job.seen > 0.0 else now) - job.t_dispatch
                )
        set_outcome(job.pending, outcome, None)
        return 0

    cdef object _results(self, FastJob job):
        """The results: new arrays copied out of the ring, and the ``Out(into=)`` buffers."""
        cdef CPlan plan = job.cplan
        cdef ResultC* r
        cdef Py_ssize_t k
        cdef uint8_t* host
        cdef cnp.ndarray arr
        if job.graph is not None:  # a replay's: its graph's pinned output block
            host = <uint8_t*><uintptr_t>job.out_at
            if plan.total > plan.in_end:
                self.bytes_down += plan.total - plan.in_end
                self.copies_down += 1
        else:
            host = self._lane[job.lane_index].ring + <uint64_t>job.ring_start % _RING
        results = []
        for k in range(plan.n_returned):
            r = &plan.returned[k]
            if r.kind == A_INTO:
                results.append(_into(job.args[r.index]))
            else:
                arr = <cnp.ndarray>cnp.PyArray_EMPTY(r.ndim, <cnp.npy_intp*>r.dims, r.type_num, 0)
                memcpy(cnp.PyArray_DATA(arr), host + r.offset, r.nbytes)
                results.append(arr)
        return tuple(results)

    # -- telemetry -----------------------------------------------------------------------------

    def flush(self, telemetry):
        """Add what this path counted since the last flush into *telemetry*."""
        telemetry.dispatches += self.dispatches
        telemetry.fast_path_dispatches += self.dispatches
        telemetry.dispatches_completed += self.completed
        telemetry.dispatches_failed += self.failed
        telemetry.bytes_up += self.bytes_up
        telemetry.bytes_down += self.bytes_down
        telemetry.copies_up += self.copies_up
        telemetry.copies_down += self.copies_down
        telemetry.graph_replays += self.replays
        self.dispatches = self.completed = self.failed = self.replays = 0
        self.bytes_up = self.bytes_down = self.copies_up = self.copies_down = 0
        for r in range(N_CLASSES):  # by class; the default class's are the backend's own histograms
            if self._submitted[r]:  # none waited in a queue
                telemetry.class_queue_wait[r].record_all([0.0] * self._submitted[r])
                self._submitted[r] = 0
            _flush_histogram(&self._latency[r], telemetry.class_latency[r])
        _flush_histogram(&self._submit_time, telemetry.submit_time)
