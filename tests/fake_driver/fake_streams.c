/* The stand-in's deferred mode: work waits in its stream's queue until the stream gets to it
 * (included by fake_cuda.c, after the events and launches).
 *
 * In the immediate mode (the default) every copy, memset, kernel and event record runs when it
 * is enqueued, so the order of streams never matters and ordering bugs cannot show. In the
 * deferred mode (FAKE_CUDA_STREAMS=deferred, or fake_set_stream_mode("deferred")) each stream
 * of ours keeps a queue of what was enqueued on it, run in order:
 *   - copies, memsets, kernels (their parameter values copied at the launch, as the driver
 *     does), event records, waits for events (cuStreamWaitEvent) and frees (cuMemFreeAsync)
 *     are queued; an allocation is made at once (its memory is used in stream order anyway);
 *   - a copy from pageable host memory takes a copy of its source at the call, and a copy into
 *     pageable host memory runs its stream up to it before returning, as the driver does;
 *   - an event completes when its stream reaches its record; a wait holds its stream until the
 *     event's record (the last one before the wait) was reached and the event completed, and
 *     running that stream runs the waited-for stream up to the record first;
 *   - the kernel spin(cycles, done) takes cycles / 2 nanoseconds (an H100's clock: a long
 *     kernel), counted from when its stream gets to it;
 *   - after a sticky fault what is queued is dropped, not run.
 * Who runs the queues: a synchronization (cuEventSynchronize, cuStreamSynchronize,
 * cuCtxSynchronize) runs what it waits for, and a query (cuEventQuery, cuStreamQuery) does as
 * FAKE_CUDA_COMPLETE says: "instant" runs the stream up to the event, "queries:N" after N
 * answers of NOT_READY, "manual" never; in "manual" the synchronizations wait too, until a test
 * runs the queues (fake_run_streams, fake_run_stream) from any thread. A graph launch, a copy
 * into pageable memory and a stream's destruction run their stream first. Streams below
 * 0x10000 (the legacy and per-thread ones, made-up handles of tests) run everything at once.
 */

enum { OP_COPY, OP_MEMSET, OP_KERNEL, OP_RECORD, OP_WAIT, OP_FREE };
enum { DRIVE_TIME = 1, DRIVE_EVENTS = 2 }; /* what a run may wait for: kernels, other events */

typedef struct fake_op {
    struct fake_op* next;
    int kind;
    unsigned long long seq;
    uintptr_t dst, src;
    size_t n;
    void* owned; /* a copy's snapshot of its pageable source, freed when it ran */
    unsigned int value, element;
    void* f;
    unsigned int dims[7];
    unsigned char params[8][16];
    int n_params;
    long long ready_ns; /* a long kernel: not done before (0: when its stream gets to it) */
    long long duration_ns;
    fake_event* event;
    unsigned long long gen;
    fake_stream* source; /* a wait: the stream the event's record is queued on */
} fake_op;

enum { IMMEDIATE, DEFERRED };
static int stream_mode = -1;
static pthread_mutex_t queue_mutex = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t queue_cond = PTHREAD_COND_INITIALIZER; /* some work ran, or completed */
static fake_stream* live_list;
static unsigned long long op_seq;
static long queued_ops, waits_enqueued;

static int deferred(void) {
    if (stream_mode < 0) {
        const char* text = getenv("FAKE_CUDA_STREAMS");
        stream_mode = text && strcmp(text, "deferred") == 0 ? DEFERRED : IMMEDIATE;
    }
    return stream_mode == DEFERRED;
}

/* Whether work enqueued on *stream* waits in a queue. */
static int queued_stream(void* stream) { return deferred() && (uintptr_t)stream >= 0x10000; }

static void streams_add(void* stream) {
    fake_stream* s = stream;
    pthread_mutex_lock(&queue_mutex);
    s->next_live = live_list;
    if (live_list) live_list->prev_live = s;
    live_list = s;
    pthread_mutex_unlock(&queue_mutex);
}

static void enqueue(fake_stream* s, fake_op* op) {
    op->seq = ++op_seq;
    if (s->last) s->last->next = op;
    else s->head = op;
    s->last = op;
    queued_ops++;
}

static fake_op* new_op(int kind) {
    fake_op* op = calloc(1, sizeof *op);
    op->kind = kind;
    return op;
}

/* Whether a wait for *event*'s record *gen* holds no more. */
static int wait_done(const fake_op* op) {
    fake_event* event = op->event;
    if (event == NULL) return 1;
    pthread_mutex_lock(&event->mutex);
    int done = event->reached_gen >= op->gen &&
               (event->recorded_gen > op->gen || event->state != NOT_READY);
    pthread_mutex_unlock(&event->mutex);
    return done;
}

static void run_op(fake_stream* s, fake_op* op) {
    if (sticky != SUCCESS && op->kind != OP_RECORD) return; /* a lost context runs nothing */
    switch (op->kind) {
    case OP_COPY:
        memcpy((void*)op->dst, op->owned ? op->owned : (const void*)op->src, op->n);
        break;
    case OP_MEMSET:
        if (op->element == 1) memset((void*)op->dst, (int)(op->value & 0xff), op->n);
        else for (size_t i = 0; i < op->n; i++) ((unsigned int*)op->dst)[i] = op->value;
        break;
    case OP_KERNEL: {
        void* params[8];
        for (int i = 0; i < op->n_params; i++) params[i] = op->params[i];
        unsigned long long threads = 1;
        for (int i = 0; i < 6; i++) threads *= op->dims[i];
        emulate(op->f, threads, params);
        break;
    }
    case OP_RECORD:
        if (op->event) reach(op->event, op->gen);
        break;
    case OP_FREE:
        fake_release(op->dst, 2);
        break;
    default: /* a wait that holds no more */
        break;
    }
    (void)s;
}

static void pop(fake_stream* s) {
    fake_op* op = s->head;
    s->head = op->next;
    if (s->head == NULL) s->last = NULL;
    queued_ops--;
    free(op->owned);
    free(op);
}

/* Run *s* (queue_mutex held) until the record *gen* of *until* was reached (NULL: until its
 * queue is empty). Waits honoured: the stream an event's record is queued on runs first. With
 * DRIVE_TIME a long kernel is waited for (queue_mutex let go meanwhile), with DRIVE_EVENTS an
 * event only a test completes too; else the run stops there. Returns whether it got there. */
static int drive(fake_stream* s, fake_event* until, unsigned long long gen, int how, int depth) {
    int ran = 0;
    for (;;) {
        if (until != NULL) {
            pthread_mutex_lock(&until->mutex);
            int reached = until->reached_gen >= gen;
            pthread_mutex_unlock(&until->mutex);
            if (reached) break;
        }
        fake_op* op = s->head;
        if (op == NULL) break;
        if (op->kind == OP_WAIT && sticky == SUCCESS && !wait_done(op)) {
            fake_stream* source = op->source;
            if (source != NULL && depth < 32 && source != s)
                drive(source, op->event, op->gen, how, depth + 1);
            if (!wait_done(op)) {
                if (!(how & DRIVE_EVENTS)) return 0;
                pthread_cond_wait(&queue_cond, &queue_mutex); /* a test completes it */
                continue;
            }
        }
        if (op->kind == OP_KERNEL && op->duration_ns && sticky == SUCCESS) {
            long long now = now_ns();
            if (op->ready_ns == 0) op->ready_ns = now + op->duration_ns;
            if (now < op->ready_ns) {
                if (!(how & DRIVE_TIME)) return 0;
                long long left = op->ready_ns - now;
                struct timespec pause = {left / 1000000000LL, left % 1000000000LL};
                pthread_mutex_unlock(&queue_mutex);
                nanosleep(&pause, NULL);
                pthread_mutex_lock(&queue_mutex);
                continue; /* another thread may have run it meanwhile */
            }
        }
        run_op(s, op);
        pop(s);
        ran = 1;
    }
    if (ran) pthread_cond_broadcast(&queue_cond);
    return until == NULL ? s->head == NULL : 1;
}

/* Run every stream's queue (queue_mutex held), the streams whose last work is the newest
 * first if *newest_first*, else the oldest first. Returns how much is left queued. */
static long drive_all(int newest_first, int how) {
    for (;;) {
        fake_stream* pick = NULL;
        for (fake_stream* s = live_list; s; s = s->next_live) {
            if (s->head == NULL) continue;
            if (pick == NULL || (newest_first ? s->last->seq > pick->last->seq
                                              : s->last->seq < pick->last->seq))
                pick = s;
        }
        if (pick == NULL || !drive(pick, NULL, 0, how, 0)) break;
    }
    return queued_ops;
}

/* -- the calls that enqueue ------------------------------------------------------------------ */

static int defer_copy(void* stream, uintptr_t dst, uintptr_t src, size_t n) {
    if (!queued_stream(stream)) return NOT_DEFERRED;
    fake_op* op = new_op(OP_COPY);
    op->dst = dst;
    op->src = src;
    op->n = n;
    int into_pageable = fake_find(dst).type == 0;
    if (fake_find(src).type == 0 && n) { /* the caller may reuse its pageable source at once */
        op->owned = malloc(n);
        memcpy(op->owned, (const void*)src, n);
    }
    pthread_mutex_lock(&queue_mutex);
    fake_stream* s = stream;
    enqueue(s, op);
    if (into_pageable) { /* synchronous: the stream runs up to this copy */
        unsigned long long mine = op->seq;
        while (s->head && s->head->seq <= mine)
            if (!drive(s, NULL, 0, DRIVE_TIME | DRIVE_EVENTS, 0)) break;
    }
    pthread_mutex_unlock(&queue_mutex);
    return SUCCESS;
}

static int defer_memset(void* stream, uintptr_t dst, unsigned int value, unsigned int element,
                        size_t n) {
    if (!queued_stream(stream)) return NOT_DEFERRED;
    fake_op* op = new_op(OP_MEMSET);
    op->dst = dst;
    op->value = value;
    op->element = element;
    op->n = n;
    pthread_mutex_lock(&queue_mutex);
    enqueue(stream, op);
    pthread_mutex_unlock(&queue_mutex);
    return SUCCESS;
}

static int defer_free(void* stream, uintptr_t ptr) {
    if (!queued_stream(stream)) return NOT_DEFERRED;
    fake_op* op = new_op(OP_FREE);
    op->dst = ptr;
    pthread_mutex_lock(&queue_mutex);
    enqueue(stream, op);
    pthread_mutex_unlock(&queue_mutex);
    return SUCCESS;
}

static int defer_launch(void* stream, void* f, const unsigned int dims[7], void** params) {
    if (!queued_stream(stream) || f == NULL || params == NULL) return NOT_DEFERRED;
    fake_op* op = new_op(OP_KERNEL);
    size_t sizes[8];
    int n = param_sizes(f, sizes);
    op->f = f;
    memcpy(op->dims, dims, sizeof op->dims);
    for (int i = 0; i < n; i++) memcpy(op->params[i], params[i], sizes[i]);
    op->n_params = n < 0 ? 0 : n; /* not emulated: only counted when it runs */
    if (n >= 1 && strcmp(((fake_kernel*)f)->name, "spin") == 0)
        op->duration_ns = *(long long*)op->params[0] / 2;
    pthread_mutex_lock(&queue_mutex);
    enqueue(stream, op);
    pthread_mutex_unlock(&queue_mutex);
    return SUCCESS;
}

static int defer_record(void* stream, fake_event* event, int outcome) {
    if (!queued_stream(stream)) return NOT_DEFERRED;
    fake_op* op = new_op(OP_RECORD);
    op->event = event;
    pthread_mutex_lock(&queue_mutex);
    pthread_mutex_lock(&event->mutex);
    op->gen = ++event->recorded_gen;
    event->record_stream = stream;
    event->state = NOT_READY;
    event->outcome = outcome;
    event->countdown = mode() == QUERIES ? complete_queries : 0;
    pthread_mutex_unlock(&event->mutex);
    enqueue(stream, op);
    pthread_mutex_unlock(&queue_mutex);
    return SUCCESS;
}

static int defer_wait(void* stream, void* handle) {
    fake_event* event = handle;
    if (!queued_stream(stream)) return NOT_DEFERRED;
    fake_op* op = new_op(OP_WAIT);
    op->event = event;
    pthread_mutex_lock(&queue_mutex);
    pthread_mutex_lock(&event->mutex);
    op->gen = event->recorded_gen;
    op->source = event->reached_gen < op->gen ? event->record_stream : NULL;
    pthread_mutex_unlock(&event->mutex);
    if (op->gen == 0 || wait_done(op)) { /* never recorded, or done: nothing to wait for */
        pthread_mutex_unlock(&queue_mutex);
        free(op);
        return SUCCESS;
    }
    waits_enqueued++;
    enqueue(stream, op);
    pthread_mutex_unlock(&queue_mutex);
    return SUCCESS;
}

/* -- the calls that run the queues ----------------------------------------------------------- */

/* Run *event*'s stream up to its last record: *how* says what for (0: nothing long). */
static void drive_event(fake_event* event, int how) {
    pthread_mutex_lock(&queue_mutex);
    pthread_mutex_lock(&event->mutex);
    unsigned long long gen = event->recorded_gen;
    fake_stream* s = event->reached_gen < gen ? event->record_stream : NULL;
    pthread_mutex_unlock(&event->mutex);
    if (s != NULL) drive(s, event, gen, how, 0);
    pthread_mutex_unlock(&queue_mutex);
}

/* Whether *event*'s last record waits in a queue still. */
static int event_queued(fake_event* event) {
    pthread_mutex_lock(&event->mutex);
    int queued = event->reached_gen < event->recorded_gen;
    pthread_mutex_unlock(&event->mutex);
    return queued;
}

/* cuStreamSynchronize and cuStreamQuery of a queued stream (*wait*: synchronize). */
static int stream_wait(void* stream, int wait) {
    fake_stream* s = stream;
    pthread_mutex_lock(&queue_mutex);
    if (wait && mode() == MANUAL) {
        while (s->head && sticky == SUCCESS) pthread_cond_wait(&queue_cond, &queue_mutex);
    } else if (s->head && (wait || mode() != MANUAL)) {
        drive(s, NULL, 0, wait ? DRIVE_TIME | DRIVE_EVENTS : 0, 0);
    }
    int busy = s->head != NULL;
    pthread_mutex_unlock(&queue_mutex);
    if (sticky != SUCCESS) return sticky;
    return busy ? NOT_READY : SUCCESS;
}

/* cuCtxSynchronize: every queue run (or, in "manual", waited for). */
static void ctx_wait(void) {
    if (!deferred()) return;
    pthread_mutex_lock(&queue_mutex);
    if (mode() == MANUAL) {
        while (queued_ops && sticky == SUCCESS) pthread_cond_wait(&queue_cond, &queue_mutex);
    } else {
        drive_all(0, DRIVE_TIME | DRIVE_EVENTS);
    }
    pthread_mutex_unlock(&queue_mutex);
}

/* A stream goes: its work runs first (the driver lets it finish), then it leaves the list. */
static void streams_remove(void* stream) {
    fake_stream* s = stream;
    pthread_mutex_lock(&queue_mutex);
    if (s->head) drive(s, NULL, 0, DRIVE_TIME, 0);
    while (s->head) pop(s); /* held by an event nobody completes: dropped */
    if (s->prev_live) s->prev_live->next_live = s->next_live;
    else if (live_list == s) live_list = s->next_live;
    if (s->next_live) s->next_live->prev_live = s->prev_live;
    pthread_mutex_unlock(&queue_mutex);
}

/* An event goes: queued records and waits of it do nothing any more. */
static void forget_event(fake_event* event) {
    pthread_mutex_lock(&queue_mutex);
    if (queued_ops)
        for (fake_stream* s = live_list; s; s = s->next_live)
            for (fake_op* op = s->head; op; op = op->next)
                if (op->event == event) op->event = NULL;
    pthread_mutex_unlock(&queue_mutex);
}

/* *ptr* is freed (cuMemFree, cuMemFreeHost): queued copies must not use it any more. One that
 * does is a bug of the caller's (it freed memory before the work using it completed): said on
 * stderr, and the queues run first, as the driver's implicit synchronization would. */
static void freeing(uintptr_t ptr, const char* call) {
    if (!__atomic_load_n(&queued_ops, __ATOMIC_SEQ_CST)) return;
    fake_allocation found = fake_find(ptr);
    uintptr_t end = ptr + (found.size ? found.size : 1);
    pthread_mutex_lock(&queue_mutex);
    int used = 0;
    for (fake_stream* s = live_list; s && !used; s = s->next_live)
        for (fake_op* op = s->head; op && !used; op = op->next)
            if (op->kind == OP_COPY || op->kind == OP_MEMSET)
                used = (op->dst >= ptr && op->dst < end) ||
                       (!op->owned && op->src >= ptr && op->src < end);
    if (used) {
        fprintf(stderr, "fake_cuda: %s of memory that queued work still uses\n", call);
        drive_all(0, DRIVE_TIME);
    }
    pthread_mutex_unlock(&queue_mutex);
}

/* A wait may hold no more: an event was completed by hand. */
static void queue_progress(void) {
    pthread_mutex_lock(&queue_mutex);
    pthread_cond_broadcast(&queue_cond);
    pthread_mutex_unlock(&queue_mutex);
}

/* Drop what is queued (fake_reset): each queued record's event completes. */
static void drop_queued(void) {
    pthread_mutex_lock(&queue_mutex);
    for (fake_stream* s = live_list; s; s = s->next_live) {
        while (s->head) {
            if (s->head->kind == OP_RECORD && s->head->event) reach(s->head->event, s->head->gen);
            pop(s);
        }
    }
    pthread_cond_broadcast(&queue_cond);
    pthread_mutex_unlock(&queue_mutex);
}

/* -- what tests call ------------------------------------------------------------------------- */

/* "deferred" or "immediate" (what is queued runs first). */
void fake_set_stream_mode(const char* name) {
    int wanted = name && strcmp(name, "deferred") == 0 ? DEFERRED : IMMEDIATE;
    pthread_mutex_lock(&queue_mutex);
    deferred();
    if (wanted == IMMEDIATE) drive_all(0, DRIVE_TIME);
    stream_mode = wanted;
    pthread_mutex_unlock(&queue_mutex);
}

/* Run every queue, the streams whose last work is the newest first if *newest_first* (the
 * order that shows a missing wait), else the oldest; long kernels are waited for, events a
 * test completes by hand are not. Returns how much work is left queued. */
long fake_run_streams(int newest_first) {
    pthread_mutex_lock(&queue_mutex);
    long left = drive_all(newest_first, DRIVE_TIME);
    pthread_mutex_unlock(&queue_mutex);
    return left;
}

/* Run *stream*'s queue (and what it waits for); whether it is empty now. */
int fake_run_stream(void* stream) {
    if (!queued_stream(stream)) return 1;
    pthread_mutex_lock(&queue_mutex);
    int done = drive(stream, NULL, 0, DRIVE_TIME, 0);
    pthread_mutex_unlock(&queue_mutex);
    return done;
}

/* How much work waits in queues; how many cuStreamWaitEvent calls there were (*enqueued*:
 * how many of them held their stream, in the deferred mode). */
long fake_queued_ops(void) {
    pthread_mutex_lock(&queue_mutex);
    long n = queued_ops;
    pthread_mutex_unlock(&queue_mutex);
    return n;
}
long fake_stream_waits(long* enqueued) {
    pthread_mutex_lock(&queue_mutex);
    if (enqueued) *enqueued = waits_enqueued;
    pthread_mutex_unlock(&queue_mutex);
    return __atomic_load_n(&wait_calls, __ATOMIC_SEQ_CST);
}
