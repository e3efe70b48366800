/* A stand-in for the CUDA driver library (libcuda.so.1), for tests on machines without a GPU.
 *
 * cuda.bindings loads libcuda.so.1 and asks cuGetProcAddress_v2 for every driver function; this
 * library answers for the few the dispatch core calls, and NOT_FOUND for the rest. Its events
 * are host objects a test completes (or fails) with fake_event_complete(), from any thread:
 * cuEventQuery reports them, cuEventSynchronize sleeps until then. cuLaunchKernel records
 * what it was given (fake_expect_params() says how many parameters), for fake_last_launch().
 */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define SUCCESS 0
#define NOT_READY 600
#define NOT_FOUND 500

typedef struct {
    pthread_mutex_t mutex;
    pthread_cond_t cond;
    int state; /* NOT_READY while running, else the code it completed with */
    long long completed_ns; /* CLOCK_MONOTONIC when fake_complete_after() completed it */
} fake_event;

static pthread_mutex_t launch_mutex = PTHREAD_MUTEX_INITIALIZER;
static unsigned long long launches;
static unsigned int last_dims[7];
static uintptr_t last_stream;
static unsigned char last_params[64 * 16];
static int param_count; /* how many slots the next launches read: fake_expect_params() */

void fake_expect_params(int n) { param_count = n < 64 ? n : 64; }

int cuDriverGetVersion(int* version) { *version = 13000; return SUCCESS; }
int cuInit(unsigned int flags) { (void)flags; return SUCCESS; }
int cuCtxSetCurrent(void* context) { (void)context; return SUCCESS; }
int cuCtxPushCurrent(void* context) { (void)context; return SUCCESS; }
int cuCtxPopCurrent(void** context) { if (context) *context = NULL; return SUCCESS; }

void* fake_event_new(void) {
    fake_event* event = calloc(1, sizeof(fake_event));
    pthread_mutex_init(&event->mutex, NULL);
    pthread_cond_init(&event->cond, NULL);
    event->state = SUCCESS;
    return event;
}

void fake_event_complete(void* handle, int code) {
    fake_event* event = handle;
    pthread_mutex_lock(&event->mutex);
    event->state = code;
    pthread_cond_broadcast(&event->cond);
    pthread_mutex_unlock(&event->mutex);
}

static void* complete_later(void* arg) {
    void** pair = arg;
    fake_event* event = pair[0];
    long long delay_ns = (long long)(intptr_t)pair[1];
    free(pair);
    struct timespec pause = {delay_ns / 1000000000LL, delay_ns % 1000000000LL};
    nanosleep(&pause, NULL);
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    pthread_mutex_lock(&event->mutex);
    event->completed_ns = now.tv_sec * 1000000000LL + now.tv_nsec;
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

int cuEventRecord(void* handle, void* stream) {
    fake_event* event = handle;
    (void)stream;
    pthread_mutex_lock(&event->mutex);
    event->state = NOT_READY;
    pthread_mutex_unlock(&event->mutex);
    return SUCCESS;
}

int cuEventQuery(void* handle) {
    fake_event* event = handle;
    pthread_mutex_lock(&event->mutex);
    int state = event->state;
    pthread_mutex_unlock(&event->mutex);
    return state;
}

int cuEventSynchronize(void* handle) {
    fake_event* event = handle;
    pthread_mutex_lock(&event->mutex);
    while (event->state == NOT_READY) pthread_cond_wait(&event->cond, &event->mutex);
    int state = event->state;
    pthread_mutex_unlock(&event->mutex);
    return state;
}

int cuLaunchKernel(void* f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx,
                   unsigned int by, unsigned int bz, unsigned int shared, void* stream,
                   void** params, void** extra) {
    (void)f; (void)extra;
    pthread_mutex_lock(&launch_mutex);
    unsigned int dims[7] = {gx, gy, gz, bx, by, bz, shared};
    memcpy(last_dims, dims, sizeof dims);
    last_stream = (uintptr_t)stream;
    /* The driver knows the kernel's parameters; this stand-in is told how many there are. */
    memset(last_params, 0, sizeof last_params);
    for (int i = 0; params && i < param_count; i++) memcpy(last_params + 16 * i, params[i], 16);
    launches++;
    pthread_mutex_unlock(&launch_mutex);
    return SUCCESS;
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

static const struct { const char* name; void* fn; } table[] = {
    {"cuDriverGetVersion", (void*)cuDriverGetVersion},
    {"cuInit", (void*)cuInit},
    {"cuCtxSetCurrent", (void*)cuCtxSetCurrent},
    {"cuCtxPushCurrent", (void*)cuCtxPushCurrent},
    {"cuCtxPopCurrent", (void*)cuCtxPopCurrent},
    {"cuEventRecord", (void*)cuEventRecord},
    {"cuEventQuery", (void*)cuEventQuery},
    {"cuEventSynchronize", (void*)cuEventSynchronize},
    {"cuLaunchKernel", (void*)cuLaunchKernel},
};

int cuGetProcAddress_v2(const char* name, void** fn, int version, unsigned long long flags,
                        int* status) {
    (void)version; (void)flags;
    for (size_t i = 0; i < sizeof table / sizeof table[0]; i++) {
        if (strcmp(name, table[i].name) == 0) {
            *fn = table[i].fn;
            if (status) *status = 0; /* CU_GET_PROC_ADDRESS_SUCCESS */
            return SUCCESS;
        }
    }
    *fn = NULL;
    if (status) *status = 1; /* CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND */
    return NOT_FOUND;
}
