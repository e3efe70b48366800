/* A stand-in for the CUDA driver library (libcuda.so.1), to run asyncgraph's whole CUDA backend
 * on a machine without a GPU.
 *
 * cuda.bindings loads libcuda.so.1 and asks cuGetProcAddress_v2 for every driver function; this
 * library answers with its own implementation where it has one (here and in the files it
 * includes: fake_device.c, fake_memory.c, fake_modules.c, fake_graphs.c), and for every other
 * name cuda.h declares with a stub that says "fake_cuda: unimplemented <name>" on stderr and
 * fails with CUDA_ERROR_NOT_SUPPORTED, so nothing the backend needs passes silently.
 *
 * Work runs at once when it is enqueued (copies are memcpy, a few kernels are run on the host:
 * fake_modules.c), unless the stream captures: then it becomes a graph's node, and runs when the
 * graph is launched (fake_graphs.c), or the deferred mode is on: then it waits in its stream's
 * queue until the stream gets to it (fake_streams.c: FAKE_CUDA_STREAMS=deferred, or
 * fake_set_stream_mode()). When a recorded event completes depends on FAKE_CUDA_COMPLETE (or
 * fake_set_complete_mode()):
 *   "manual" (the default): when a test calls fake_event_complete(), from any thread;
 *   "instant": at once;
 *   "queries:N": after answering NOT_READY to N queries (cuEventSynchronize returns at once);
 *   "after:US[:JITTER]": US microseconds after its record, plus up to JITTER more drawn at
 *   random, as a kernel of that length would (cuEventSynchronize sleeps until then); on
 *   immediate streams only (a deferred stream's event completes at once).
 * An event recorded in one mode and queried after a switch to "instant" is complete. In the
 * deferred mode an event completes when its stream reaches its record, and the mode says who
 * runs the queue (fake_streams.c).
 * fake_fail_next_events(count, code) makes the next recorded events complete with *code*; a
 * sticky one (an illegal address, say) then fails every later call that enqueues, allocates,
 * frees, records, queries or synchronizes, as a faulted process does (POISONED()).
 * fake_fail_next(call, count, code) makes the next *count* calls of a kind fail at once with
 * *code*, nothing done: "record" (cuEventRecord), "launch" (cuLaunchKernel), "copy" (the
 * asynchronous copies), "alloc" (device allocations) or "sync" (cuStreamSynchronize). cuLaunchKernel records what it was given
 * (fake_expect_params() says how many parameters to keep), for fake_last_launch().
 * fake_set_host_cost(call, us) makes each call of a kind take *us* microseconds of host time
 * more (a busy wait, as a driver's own work would): "launch" (cuLaunchKernel outside a capture)
 * or "graph_launch" (cuGraphLaunch); the tests make eager dispatches or replays the dearer so.
 * fake_reset() forgets injected failures, host costs, the fault and what is queued.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define SUCCESS 0
#define INVALID_VALUE 1
#define OUT_OF_MEMORY 2
#define INVALID_DEVICE 101
#define INVALID_CONTEXT 201
#define INVALID_HANDLE 400
#define NOT_FOUND 500
#define NOT_READY 600
#define ILLEGAL_ADDRESS 700
#define NOT_SUPPORTED 801
#define ILLEGAL_STATE 401
#define CAPTURE_UNSUPPORTED 900
#define CAPTURE_INVALIDATED 901
#define CAPTURE_MERGE 902
#define CAPTURE_UNMATCHED 903
#define CAPTURE_WRONG_THREAD 908
#define GRAPH_EXEC_UPDATE_FAILURE 910

/* The error a faulted context answers with. As the driver does (580, measured on two GPUs), a
 * sticky fault poisons the whole process: every context of every device then answers queries,
 * synchronizations, allocations, frees, copies, launches and loads with it (POISONED()). */
static int sticky = SUCCESS;
#define POISONED()                                  \
    do {                                            \
        if (sticky != SUCCESS) return sticky;       \
    } while (0)

/* Stream capture (fake_graphs.c). Work enqueued on a capturing stream becomes a node of the
 * capture's graph instead of running: each enqueuing entry point asks its hook first, which
 * answers NOT_CAPTURED when the stream does not capture (then the work runs as always), else
 * the entry point's result. capture_forbids() guards the calls a capture does not allow. */
#define NOT_CAPTURED (-1)
#define MAX_TAIL 16 /* the most nodes a capturing stream's next work may depend on */
static int capture_copy(void* stream, uintptr_t dst, uintptr_t src, size_t n);
static int capture_memset(void* stream, uintptr_t dst, unsigned int value, unsigned int element,
                          size_t n);
static int capture_launch(void* stream, void* f, const unsigned int dims[7], void** params);
static int capture_record(void* stream, void* event, unsigned int flags);
static int capture_wait(void* stream, void* event, unsigned int flags);
static int capture_refuses(void* stream, const char* name);
static int capture_forbids(void* stream);
static void capture_forget_stream(void* stream);

/* Failures injected into the next recorded events (fake_fail_next_events), and into the next
 * calls of a kind (fake_fail_next): INJECTED(kind) returns the code from the calling entry
 * point while any are left. */
static pthread_mutex_t fail_mutex = PTHREAD_MUTEX_INITIALIZER;
static int fail_count, fail_code;
typedef struct {
    int count, code;
} fake_injection;
static fake_injection inject_record, inject_launch, inject_copy, inject_alloc, inject_sync;
static int injected(fake_injection* injection) {
    if (__atomic_load_n(&injection->count, __ATOMIC_ACQUIRE) <= 0) return SUCCESS;
    int code = SUCCESS;
    pthread_mutex_lock(&fail_mutex);
    if (injection->count > 0) {
        injection->count--;
        code = injection->code;
    }
    pthread_mutex_unlock(&fail_mutex);
    return code;
}
#define INJECTED(kind)                                      \
    do {                                                    \
        int injected_code = injected(&inject_##kind);       \
        if (injected_code != SUCCESS) return injected_code; \
    } while (0)

/* The deferred mode (fake_streams.c), which the memory and stream calls use. */
#define NOT_DEFERRED (-2)
static long wait_calls; /* cuStreamWaitEvent calls (fake_stream_waits) */
static int deferred(void);
static int queued_stream(void* stream);
static int defer_copy(void* stream, uintptr_t dst, uintptr_t src, size_t n);
static int defer_memset(void* stream, uintptr_t dst, unsigned int value, unsigned int element,
                        size_t n);
static int defer_free(void* stream, uintptr_t ptr);
static int defer_wait(void* stream, void* event);
static int stream_wait(void* stream, int wait);
static void streams_add(void* stream);
static void streams_remove(void* stream);
static void freeing(uintptr_t ptr, const char* call);
static void ctx_wait(void);
static void run_queues(void);
static void drop_queued(void);
static int defer_launch(void* stream, void* f, const unsigned int dims[7], void** params);

#include "fake_device.c"
#include "fake_memory.c"
#include "fake_modules.c"

/* -- events --------------------------------------------------------------------------------- */

typedef struct {
    pthread_mutex_t mutex;
    pthread_cond_t cond;
    int state;              /* NOT_READY while running, else the code it completed with */
    int outcome;            /* what a running event completes with */
    int countdown;          /* queries still answered NOT_READY ("queries:N") */
    long long due_ns;       /* CLOCK_MONOTONIC when it completes ("after:US[:JITTER]") */
    long long completed_ns; /* CLOCK_MONOTONIC when fake_complete_after() completed it */
    long long recorded_ns;  /* CLOCK_MONOTONIC at its last record (elapsed times), 0: never */
    unsigned int flags;     /* as created: CU_EVENT_DISABLE_TIMING (2) refuses elapsed times */
    void* next;             /* every live event, for a switch to "instant" */
    void* prev;
    /* Recorded on a capturing stream (under graph_mutex, fake_graphs.c): the capture's id (0:
     * none) and the nodes the recording stream's next work depended on, for a stream that
     * waits for the event to join the capture there. */
    unsigned long long capture_id;
    void* tail[MAX_TAIL];
    size_t n_tail;
    /* Records made, and the last one its stream reached (they differ while one is queued in the
     * deferred mode), and the stream the last one is queued on. */
    unsigned long long recorded_gen, reached_gen;
    void* record_stream;
} fake_event;

enum { MANUAL, INSTANT, QUERIES, AFTER };
static int complete_mode = -1;
static int complete_queries;
static long long after_ns, after_jitter_ns; /* "after:US[:JITTER]" */
static long live_events, events_created;
static pthread_mutex_t events_mutex = PTHREAD_MUTEX_INITIALIZER;
static fake_event* all_events;

static void set_mode(const char* mode, int sweep) {
    if (mode && strcmp(mode, "instant") == 0) {
        complete_mode = INSTANT;
        if (!sweep) return;
        run_queues(); /* the deferred mode: what is queued runs */
        /* What runs now completes, and a thread waiting on it wakes. */
        pthread_mutex_lock(&events_mutex);
        for (fake_event* event = all_events; event; event = event->next) {
            pthread_mutex_lock(&event->mutex);
            if (event->state == NOT_READY) event->state = event->outcome;
            pthread_cond_broadcast(&event->cond);
            pthread_mutex_unlock(&event->mutex);
        }
        pthread_mutex_unlock(&events_mutex);
    } else if (mode && strncmp(mode, "after:", 6) == 0) {
        complete_mode = AFTER;
        char* rest = NULL;
        after_ns = (long long)(strtod(mode + 6, &rest) * 1000.0);
        after_jitter_ns = rest && *rest == ':' ? (long long)(strtod(rest + 1, NULL) * 1000.0) : 0;
    } else if (mode && strncmp(mode, "queries:", 8) == 0) {
        complete_mode = QUERIES;
        complete_queries = atoi(mode + 8);
    } else {
        complete_mode = MANUAL;
    }
}

void fake_set_complete_mode(const char* mode) { set_mode(mode, 1); }

/* The mode, read from $FAKE_CUDA_COMPLETE at the first use: nothing was recorded before, so
 * there is nothing to complete (and the caller may hold an event's lock). */
static int mode(void) {
    if (complete_mode < 0) set_mode(getenv("FAKE_CUDA_COMPLETE"), 0);
    return complete_mode;
}

void fake_fail_next_events(int count, int code) {
    pthread_mutex_lock(&fail_mutex);
    fail_count = count;
    fail_code = code;
    pthread_mutex_unlock(&fail_mutex);
}

/* The next *count* calls of *kind* ("record", "launch", "copy", "alloc", "sync") fail with
 * *code*. */
int fake_fail_next(const char* kind, int count, int code) {
    fake_injection* injection = strcmp(kind, "record") == 0   ? &inject_record
                                : strcmp(kind, "launch") == 0 ? &inject_launch
                                : strcmp(kind, "copy") == 0   ? &inject_copy
                                : strcmp(kind, "alloc") == 0  ? &inject_alloc
                                : strcmp(kind, "sync") == 0   ? &inject_sync
                                                              : NULL;
    if (injection == NULL) return INVALID_VALUE;
    pthread_mutex_lock(&fail_mutex);
    injection->code = code;
    __atomic_store_n(&injection->count, count, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&fail_mutex);
    return SUCCESS;
}

/* Host time added to each call of a kind (fake_set_host_cost), in nanoseconds. */
static long long launch_cost_ns, graph_launch_cost_ns;

int fake_set_host_cost(const char* kind, double us) {
    long long* cost = strcmp(kind, "launch") == 0         ? &launch_cost_ns
                      : strcmp(kind, "graph_launch") == 0 ? &graph_launch_cost_ns
                                                          : NULL;
    if (cost == NULL || us < 0) return INVALID_VALUE;
    __atomic_store_n(cost, (long long)(us * 1000.0), __ATOMIC_RELEASE);
    return SUCCESS;
}

static long long now_ns(void);

/* Spend *cost* nanoseconds of this thread's time (a busy wait: sleeps are coarser). */
static void host_cost(const long long* cost) {
    long long ns = __atomic_load_n(cost, __ATOMIC_ACQUIRE);
    if (ns <= 0) return;
    long long until = now_ns() + ns;
    while (now_ns() < until) {
    }
}

/* Forget injected failures, host costs, a fault and what is queued: the next scenario starts
 * with a healthy context. */
void fake_reset(void) {
    __atomic_store_n(&launch_cost_ns, 0, __ATOMIC_RELEASE);
    __atomic_store_n(&graph_launch_cost_ns, 0, __ATOMIC_RELEASE);
    pthread_mutex_lock(&fail_mutex);
    fail_count = 0;
    inject_record.count = inject_launch.count = inject_copy.count = inject_alloc.count = 0;
    inject_sync.count = 0;
    pthread_mutex_unlock(&fail_mutex);
    drop_queued();
    sticky = SUCCESS;
}

static long long now_ns(void) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return now.tv_sec * 1000000000LL + now.tv_nsec;
}

void* fake_event_new(void) {
    fake_event* event = calloc(1, sizeof(fake_event));
    pthread_mutex_init(&event->mutex, NULL);
    pthread_cond_init(&event->cond, NULL);
    event->state = SUCCESS;
    pthread_mutex_lock(&events_mutex);
    event->next = all_events;
    if (all_events) all_events->prev = event;
    all_events = event;
    live_events++;
    events_created++;
    pthread_mutex_unlock(&events_mutex);
    return event;
}

/* How many events were ever created (fake_live_events(): how many are not destroyed). */
long fake_events_created(void) {
    pthread_mutex_lock(&events_mutex);
    long n = events_created;
    pthread_mutex_unlock(&events_mutex);
    return n;
}

long fake_live_events(void) {
    pthread_mutex_lock(&events_mutex);
    long n = live_events;
    pthread_mutex_unlock(&events_mutex);
    return n;
}

int cuEventCreate(void** handle, unsigned int flags) {
    need_context("cuEventCreate");
    POISONED();
    fake_event* event = fake_event_new();
    event->flags = flags;
    *handle = event;
    return SUCCESS;
}

static void forget_event(fake_event* event);

int cuEventDestroy(void* handle) {
    fake_event* event = handle;
    forget_event(event); /* queued records and waits of it do nothing now */
    pthread_mutex_lock(&events_mutex);
    if (event->prev) ((fake_event*)event->prev)->next = event->next;
    else all_events = event->next;
    if (event->next) ((fake_event*)event->next)->prev = event->prev;
    live_events--;
    pthread_mutex_unlock(&events_mutex);
    pthread_mutex_destroy(&event->mutex);
    pthread_cond_destroy(&event->cond);
    free(event);
    return SUCCESS;
}

static void queue_progress(void);

void fake_event_complete(void* handle, int code) {
    fake_event* event = handle;
    pthread_mutex_lock(&event->mutex);
    event->state = code;
    event->reached_gen = event->recorded_gen; /* a queued record of it does nothing now */
    pthread_cond_broadcast(&event->cond);
    pthread_mutex_unlock(&event->mutex);
    queue_progress(); /* a stream waiting for it goes on */
}

static void* complete_later(void* arg) {
    void** pair = arg;
    fake_event* event = pair[0];
    long long delay_ns = (long long)(intptr_t)pair[1];
    free(pair);
    struct timespec pause = {delay_ns / 1000000000LL, delay_ns % 1000000000LL};
    nanosleep(&pause, NULL);
    pthread_mutex_lock(&event->mutex);
    event->completed_ns = now_ns();
    event->state = SUCCESS;
    pthread_cond_broadcast(&event->cond);
    pthread_mutex_unlock(&event->mutex);
    return NULL;
}

/* Complete *handle* successfully after *delay_ns*, from a thread outside Python, and note when
 * (fake_completed_ns): a benchmark times how long the completion takes to reach the loop. */
int fake_complete_after(void* handle, long long delay_ns) {
    void** pair = malloc(2 * sizeof(void*));
    pair[0] = handle;
    pair[1] = (void*)(intptr_t)delay_ns;
    pthread_t thread;
    int error = pthread_create(&thread, NULL, complete_later, pair);
    if (error == 0) pthread_detach(thread);
    return error;
}

long long fake_completed_ns(void* handle) {
    fake_event* event = handle;
    pthread_mutex_lock(&event->mutex);
    long long when = event->completed_ns;
    pthread_mutex_unlock(&event->mutex);
    return when;
}

/* What the next recorded event completes with (fake_fail_next_events). */
static int next_outcome(void) {
    int outcome = SUCCESS;
    pthread_mutex_lock(&fail_mutex);
    if (fail_count > 0) {
        fail_count--;
        outcome = fail_code;
    }
    pthread_mutex_unlock(&fail_mutex);
    return outcome;
}

static int is_sticky_code(int code) { return code == ILLEGAL_ADDRESS || (code >= 700 && code < 720); }

/* "after:US[:JITTER]": how long after its record an event completes, jitter drawn at random. */
static long long due_after(void) {
    static unsigned int seed = 12345;
    long long jitter = after_jitter_ns > 0 ? (long long)(rand_r(&seed) % (after_jitter_ns + 1)) : 0;
    return after_ns + jitter;
}

/* Record *handle* now (it completes as the mode says): a record outside a capture, or a graph's
 * event record node running. */
static int record_now(void* handle) {
    fake_event* event = handle;
    int outcome = next_outcome();
    if (is_sticky_code(outcome)) sticky = outcome;
    pthread_mutex_lock(&event->mutex);
    event->reached_gen = ++event->recorded_gen;
    event->recorded_ns = now_ns();
    event->outcome = outcome;
    int how = mode();
    if (how == INSTANT) {
        event->state = outcome;
    } else {
        event->state = NOT_READY;
        event->countdown = how == QUERIES ? complete_queries : 0;
        event->due_ns = how == AFTER ? event->recorded_ns + due_after() : 0;
    }
    pthread_mutex_unlock(&event->mutex);
    return SUCCESS;
}

/* The deferred mode's record of *event*'s generation *gen* was reached by its stream: the
 * event completes, unless recorded again since. */
static void reach(fake_event* event, unsigned long long gen) {
    pthread_mutex_lock(&event->mutex);
    if (gen > event->reached_gen) {
        event->reached_gen = gen;
        if (gen == event->recorded_gen) {
            event->recorded_ns = now_ns();
            if (is_sticky_code(event->outcome)) sticky = event->outcome;
            event->state = event->outcome;
            pthread_cond_broadcast(&event->cond);
        }
    }
    pthread_mutex_unlock(&event->mutex);
}

static int defer_record(void* stream, fake_event* event, int outcome);

int cuEventRecordWithFlags(void* handle, void* stream, unsigned int flags) {
    need_stream_context(stream, "cuEventRecord");
    POISONED();
    INJECTED(record);
    int captured = capture_record(stream, handle, flags);
    if (captured != NOT_CAPTURED) return captured;
    if (queued_stream(stream)) return defer_record(stream, handle, next_outcome());
    return record_now(handle);
}

int cuEventRecord(void* handle, void* stream) { return cuEventRecordWithFlags(handle, stream, 0); }

static int event_queued(fake_event* event);
static void drive_event(fake_event* event, int how);

int cuEventQuery(void* handle) {
    fake_event* event = handle;
    int forbidden = capture_forbids(NULL);
    if (forbidden != SUCCESS) return forbidden;
    if (sticky != SUCCESS) return sticky;
    if (event_queued(event)) { /* the deferred mode: the stream runs up to it, as the mode says */
        int how = mode(), now = how == INSTANT || how == AFTER; /* "after": immediate streams */
        if (how == QUERIES) {
            pthread_mutex_lock(&event->mutex);
            now = event->countdown-- <= 0;
            pthread_mutex_unlock(&event->mutex);
        }
        if (now) drive_event(event, 0);
        if (sticky != SUCCESS) return sticky;
        pthread_mutex_lock(&event->mutex);
        int state = event->state;
        pthread_mutex_unlock(&event->mutex);
        return state;
    }
    pthread_mutex_lock(&event->mutex);
    if (event->state == NOT_READY && mode() == QUERIES) {
        if (event->countdown > 0) event->countdown--;
        else event->state = event->outcome;
    } else if (event->state == NOT_READY && mode() == AFTER) {
        if (now_ns() >= event->due_ns) event->state = event->outcome;
    } else if (event->state == NOT_READY && mode() == INSTANT) {
        event->state = event->outcome; /* recorded in another mode: done now */
    }
    int state = event->state;
    pthread_mutex_unlock(&event->mutex);
    return state;
}

int cuEventSynchronize(void* handle) {
    fake_event* event = handle;
    int forbidden = capture_forbids(NULL);
    if (forbidden != SUCCESS) return forbidden;
    /* The deferred mode: the stream runs up to it (in "manual", a test runs it). */
    if (mode() != MANUAL && event_queued(event)) drive_event(event, 3);
    pthread_mutex_lock(&event->mutex);
    if (event->state == NOT_READY && mode() == AFTER) { /* sleeps until it is due */
        long long left = event->due_ns - now_ns();
        if (left > 0) {
            struct timespec pause = {left / 1000000000LL, left % 1000000000LL};
            pthread_mutex_unlock(&event->mutex);
            nanosleep(&pause, NULL);
            pthread_mutex_lock(&event->mutex);
        }
    }
    if (event->state == NOT_READY && mode() != MANUAL && event->reached_gen == event->recorded_gen)
        event->state = event->outcome;
    while (event->state == NOT_READY) pthread_cond_wait(&event->cond, &event->mutex);
    int state = event->state;
    pthread_mutex_unlock(&event->mutex);
    return sticky != SUCCESS ? sticky : state;
}

/* The milliseconds between the records of *start* and *end*, checked as the driver checks: both
 * made with timing and recorded, and *end* complete (then so is *start*, recorded before it on
 * the same stream; the stand-in does not ask). Outside "manual" mode *end* is complete once
 * recorded, queried or not, as a later event's completion on its stream would imply. */
int cuEventElapsedTime(float* ms, void* start_handle, void* end_handle) {
    fake_event* start = start_handle;
    fake_event* end = end_handle;
    if (sticky != SUCCESS) return sticky;
    if ((start->flags | end->flags) & 2) return INVALID_HANDLE;
    pthread_mutex_lock(&start->mutex);
    long long begun = start->recorded_ns;
    pthread_mutex_unlock(&start->mutex);
    pthread_mutex_lock(&end->mutex);
    long long ended = end->recorded_ns;
    int state = end->state;
    /* The work ran when it was enqueued: only a test completing events by hand, or the deferred
     * mode, says otherwise. */
    if (state == NOT_READY && mode() != MANUAL && end->reached_gen == end->recorded_gen)
        state = end->outcome;
    if (state == NOT_READY) {
        pthread_mutex_unlock(&end->mutex);
        return NOT_READY;
    }
    pthread_mutex_unlock(&end->mutex);
    if (begun == 0 || ended == 0) return INVALID_HANDLE;
    if (state != SUCCESS) return state;
    long long ns = ended - begun;
    *ms = ns > 0 ? (float)ns / 1e6f : 0.0005f;
    return SUCCESS;
}

/* -- launches --------------------------------------------------------------------------------- */

static pthread_mutex_t launch_mutex = PTHREAD_MUTEX_INITIALIZER;
static unsigned long long launches;
static unsigned int last_dims[7];
static uintptr_t last_stream;
static unsigned char last_params[64 * 16];
static int param_count; /* how many slots the next launches keep: fake_expect_params() */

void fake_expect_params(int n) { param_count = n < 64 ? n : 64; }

/* Note a launch (fake_last_launch). */
static void note_launch(const unsigned int dims[7], void* stream, void** params) {
    pthread_mutex_lock(&launch_mutex);
    memcpy(last_dims, dims, sizeof last_dims);
    last_stream = (uintptr_t)stream;
    /* The driver knows the kernel's parameters; this stand-in is told how many there are. */
    memset(last_params, 0, sizeof last_params);
    for (int i = 0; params && i < param_count; i++) memcpy(last_params + 16 * i, params[i], 16);
    launches++;
    pthread_mutex_unlock(&launch_mutex);
}

/* Launch *f* now: note the launch and run it if it is emulated. A launch outside a capture,
 * or a graph's kernel node running. */
static int launch_now(void* f, const unsigned int dims[7], void* stream, void** params) {
    note_launch(dims, stream, params);
    if (f != NULL && params != NULL) {
        unsigned long long threads = 1;
        for (int i = 0; i < 6; i++) threads *= dims[i];
        emulate(f, threads, params);
    }
    return SUCCESS;
}

int cuLaunchKernel(void* f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx,
                   unsigned int by, unsigned int bz, unsigned int shared, void* stream,
                   void** params, void** extra) {
    (void)extra;
    need_stream_context(stream, "cuLaunchKernel");
    POISONED();
    INJECTED(launch);
    unsigned int dims[7] = {gx, gy, gz, bx, by, bz, shared};
    int captured = capture_launch(stream, f, dims, params);
    if (captured != NOT_CAPTURED) return captured;
    host_cost(&launch_cost_ns);
    if (defer_launch(stream, f, dims, params) == NOT_DEFERRED) return launch_now(f, dims, stream, params);
    note_launch(dims, stream, params);
    return SUCCESS;
}

typedef struct {
    unsigned int gx, gy, gz, bx, by, bz, shared;
    void* stream;
} fake_launch_config;

int cuLaunchKernelEx(const fake_launch_config* config, void* f, void** params, void** extra) {
    return cuLaunchKernel(f, config->gx, config->gy, config->gz, config->bx, config->by,
                          config->bz, config->shared, config->stream, params, extra);
}

/* What the last launch was given: 7 dimensions (grid, block, shared memory), the stream, and
 * the first n 16-byte parameter slots. Returns how many launches there were. */
unsigned long long fake_last_launch(unsigned int* dims, uintptr_t* stream, unsigned char* params,
                                    int n) {
    pthread_mutex_lock(&launch_mutex);
    memcpy(dims, last_dims, sizeof last_dims);
    *stream = last_stream;
    memcpy(params, last_params, 16 * (size_t)n);
    unsigned long long count = launches;
    pthread_mutex_unlock(&launch_mutex);
    return count;
}

#include "fake_streams.c"
#include "fake_graphs.c"

static void run_queues(void) {
    pthread_mutex_lock(&queue_mutex);
    drive_all(0, DRIVE_TIME);
    pthread_mutex_unlock(&queue_mutex);
}

/* -- the entry points ------------------------------------------------------------------------ */

#define ENTRY(n) {#n, (void*)n}
static const struct { const char* name; void* fn; } table[] = {
    ENTRY(cuInit), ENTRY(cuDriverGetVersion), ENTRY(cuGetErrorName), ENTRY(cuGetErrorString),
    ENTRY(cuDeviceGetCount), ENTRY(cuDeviceGet), ENTRY(cuDeviceGetName), ENTRY(cuDeviceTotalMem),
    ENTRY(cuDeviceGetUuid), ENTRY(cuDeviceGetPCIBusId), ENTRY(cuDeviceGetAttribute),
    ENTRY(cuDeviceCanAccessPeer), ENTRY(cuDevicePrimaryCtxRetain),
    ENTRY(cuDevicePrimaryCtxRelease), ENTRY(cuDevicePrimaryCtxGetState),
    ENTRY(cuDeviceGetDefaultMemPool), ENTRY(cuDeviceGetMemPool),
    ENTRY(cuCtxCreate), ENTRY(cuCtxDestroy),
    ENTRY(cuCtxGetCurrent), ENTRY(cuCtxSetCurrent), ENTRY(cuCtxPushCurrent),
    ENTRY(cuCtxPopCurrent), ENTRY(cuCtxGetDevice), ENTRY(cuCtxGetId), ENTRY(cuCtxGetApiVersion),
    ENTRY(cuCtxGetFlags), ENTRY(cuCtxSynchronize), ENTRY(cuCtxGetStreamPriorityRange),
    ENTRY(cuMemAlloc), ENTRY(cuMemFree), ENTRY(cuMemHostAlloc), ENTRY(cuMemAllocHost),
    ENTRY(cuMemFreeHost), ENTRY(cuMemGetInfo), ENTRY(cuMemHostGetDevicePointer), ENTRY(cuMemPoolCreate),
    ENTRY(cuMemPoolDestroy), ENTRY(cuMemPoolTrimTo), ENTRY(cuMemPoolSetAttribute),
    ENTRY(cuMemPoolGetAttribute), ENTRY(cuMemPoolSetAccess), ENTRY(cuMemPoolGetAccess), ENTRY(cuMemAllocFromPoolAsync),
    ENTRY(cuMemAllocAsync), ENTRY(cuMemFreeAsync), ENTRY(cuMemcpy), ENTRY(cuMemcpyAsync),
    ENTRY(cuMemcpyHtoD), ENTRY(cuMemcpyDtoH), ENTRY(cuMemcpyDtoD), ENTRY(cuMemcpyHtoDAsync),
    ENTRY(cuMemcpyDtoHAsync), ENTRY(cuMemcpyDtoDAsync), ENTRY(cuMemcpyPeerAsync),
    ENTRY(cuMemcpyPeer), ENTRY(cuCtxEnablePeerAccess), ENTRY(cuMemsetD8),
    ENTRY(cuMemsetD8Async), ENTRY(cuMemsetD32), ENTRY(cuMemsetD32Async),
    ENTRY(cuPointerGetAttribute), ENTRY(cuPointerGetAttributes),
    ENTRY(cuStreamCreate), ENTRY(cuStreamCreateWithPriority), ENTRY(cuStreamDestroy),
    ENTRY(cuStreamGetFlags), ENTRY(cuStreamGetPriority), ENTRY(cuStreamGetId),
    ENTRY(cuStreamGetCtx), ENTRY(cuStreamGetDevice), ENTRY(cuStreamSynchronize),
    ENTRY(cuStreamQuery), ENTRY(cuStreamWaitEvent), ENTRY(cuStreamIsCapturing),
    ENTRY(cuStreamGetCaptureInfo),
    ENTRY(cuEventCreate), ENTRY(cuEventDestroy), ENTRY(cuEventRecord),
    ENTRY(cuEventRecordWithFlags), ENTRY(cuEventQuery), ENTRY(cuEventSynchronize),
    ENTRY(cuEventElapsedTime),
    ENTRY(cuLibraryLoadData), ENTRY(cuLibraryUnload), ENTRY(cuLibraryGetKernel),
    ENTRY(cuModuleLoadData), ENTRY(cuModuleUnload), ENTRY(cuModuleGetFunction),
    ENTRY(cuLibraryGetModule), ENTRY(cuKernelGetFunction), ENTRY(cuKernelGetName),
    ENTRY(cuFuncGetName), ENTRY(cuKernelGetAttribute), ENTRY(cuFuncGetAttribute),
    ENTRY(cuKernelSetAttribute), ENTRY(cuFuncSetAttribute),
    ENTRY(cuLaunchKernel), ENTRY(cuLaunchKernelEx),
    ENTRY(cuStreamBeginCapture), ENTRY(cuStreamBeginCaptureToGraph), ENTRY(cuStreamEndCapture),
    ENTRY(cuStreamUpdateCaptureDependencies), ENTRY(cuThreadExchangeStreamCaptureMode),
    ENTRY(cuGraphCreate), ENTRY(cuGraphDestroy), ENTRY(cuGraphAddKernelNode),
    ENTRY(cuGraphAddMemcpyNode), ENTRY(cuGraphAddMemsetNode), ENTRY(cuGraphAddEmptyNode),
    ENTRY(cuGraphAddEventRecordNode), ENTRY(cuGraphAddEventWaitNode), ENTRY(cuGraphAddNode),
    ENTRY(cuGraphGetNodes), ENTRY(cuGraphGetRootNodes), ENTRY(cuGraphGetEdges),
    ENTRY(cuGraphNodeGetDependencies), ENTRY(cuGraphNodeGetDependentNodes),
    ENTRY(cuGraphNodeGetType), ENTRY(cuGraphNodeGetContainingGraph), ENTRY(cuGraphGetId),
    ENTRY(cuGraphKernelNodeGetParams), ENTRY(cuGraphKernelNodeSetParams),
    ENTRY(cuGraphMemcpyNodeGetParams), ENTRY(cuGraphMemsetNodeGetParams),
    ENTRY(cuGraphNodeGetParams), ENTRY(cuGraphNodeSetParams),
    {"cuGraphInstantiate", (void*)cuGraphInstantiateWithFlags}, /* cuda.h's alias of it */
    ENTRY(cuGraphInstantiateWithFlags), ENTRY(cuGraphInstantiateWithParams),
    ENTRY(cuGraphExecDestroy), ENTRY(cuGraphExecGetFlags), ENTRY(cuGraphExecGetId),
    ENTRY(cuGraphUpload), ENTRY(cuGraphLaunch), ENTRY(cuGraphExecKernelNodeSetParams),
    ENTRY(cuGraphExecMemcpyNodeSetParams), ENTRY(cuGraphExecMemsetNodeSetParams),
    ENTRY(cuGraphExecNodeSetParams), ENTRY(cuGraphExecUpdate), ENTRY(cuUserObjectCreate),
    ENTRY(cuUserObjectRetain), ENTRY(cuUserObjectRelease), ENTRY(cuGraphRetainUserObject),
    ENTRY(cuGraphReleaseUserObject),
};

static void fake_unimplemented(const char* name) {
    fprintf(stderr, "fake_cuda: unimplemented %s\n", name);
}

#define NAME(n) static int stub_##n(void) { fake_unimplemented(#n); return NOT_SUPPORTED; }
#include "fake_names.h"
#undef NAME
static const struct { const char* name; void* fn; } stubs[] = {
#define NAME(n) {#n, (void*)stub_##n},
#include "fake_names.h"
#undef NAME
};

int cuGetProcAddress_v2(const char* name, void** fn, int version, unsigned long long flags,
                        int* status) {
    (void)version; (void)flags;
    if (strcmp(name, "cuGetProcAddress") == 0) { /* the bindings ask for it too */
        *fn = (void*)cuGetProcAddress_v2;
        if (status) *status = 0;
        return SUCCESS;
    }
    for (size_t i = 0; i < sizeof table / sizeof table[0]; i++) {
        if (strcmp(name, table[i].name) == 0) {
            *fn = table[i].fn;
            if (status) *status = 0; /* CU_GET_PROC_ADDRESS_SUCCESS */
            return SUCCESS;
        }
    }
    for (size_t i = 0; i < sizeof stubs / sizeof stubs[0]; i++) {
        if (strcmp(name, stubs[i].name) == 0) {
            *fn = stubs[i].fn;
            if (status) *status = 0;
            return SUCCESS;
        }
    }
    *fn = NULL;
    if (status) *status = 1; /* CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND */
    return NOT_FOUND;
}
