/* The stand-in's device, contexts and error names (included by fake_cuda.c).
 *
 * FAKE_CUDA_DEVICES devices (1 unless set), each "asyncgraph stand-in" of compute capability 9.0
 * with an H100's launch limits, one primary context each, up to 8 more contexts made with
 * cuCtxCreate (as another library would), and a current-context stack per thread. A stream
 * belongs to the context current when it was made (cuStreamGetCtx).
 */

typedef struct {
    int device;
    int retained;
} fake_context;

static fake_context contexts[8];
static fake_context created[8]; /* contexts of cuCtxCreate; device -1 while free */
static pthread_mutex_t created_mutex = PTHREAD_MUTEX_INITIALIZER;
static int created_used[8];
static __thread fake_context* ctx_stack[16];
static __thread int ctx_depth; /* the current context is ctx_stack[ctx_depth - 1] */

/* Driver calls made outside the context they need (fake_wrong_context_calls): with no context
 * current, or with a context of cuCtxCreate current (the stand-in's backends use primary ones),
 * or on a stream of another context than the current one. A real driver fails some of these
 * and quietly works in the wrong context for others. Event and stream queries and
 * synchronizations, which a real driver answers in any context, are not counted. */
static long wrong_context;
static const char* first_wrong_call;
long fake_wrong_context_calls(void) { return __atomic_load_n(&wrong_context, __ATOMIC_SEQ_CST); }
const char* fake_first_wrong_context_call(void) { return first_wrong_call ? first_wrong_call : ""; }
static void wrong(const char* call) {
    if (__atomic_fetch_add(&wrong_context, 1, __ATOMIC_SEQ_CST) == 0) first_wrong_call = call;
    if (getenv("FAKE_CUDA_ABORT_ON_WRONG_CONTEXT")) { /* python -X faulthandler: who called */
        fprintf(stderr, "fake_cuda: %s outside its context\n", call);
        abort();
    }
}
static void* current_context(void) { return ctx_depth ? ctx_stack[ctx_depth - 1] : NULL; }
/* A call that needs a primary context current. */
static void need_context(const char* call) {
    fake_context* c = current_context();
    if (c == NULL || c < contexts || c >= contexts + 8) wrong(call);
}

static int device_count(void) {
    const char* text = getenv("FAKE_CUDA_DEVICES");
    int n = text ? atoi(text) : 1;
    return n < 0 ? 0 : (n > 8 ? 8 : n);
}

int cuInit(unsigned int flags) { (void)flags; return SUCCESS; }
int cuDriverGetVersion(int* version) { *version = 13000; return SUCCESS; }

int cuDeviceGetCount(int* count) { *count = device_count(); return SUCCESS; }

int cuDeviceGet(int* device, int ordinal) {
    if (ordinal < 0 || ordinal >= device_count()) return INVALID_DEVICE;
    *device = ordinal;
    return SUCCESS;
}

int cuDeviceGetName(char* name, int length, int device) {
    (void)device;
    snprintf(name, (size_t)length, "asyncgraph stand-in");
    return SUCCESS;
}

static unsigned long long device_limit; /* fake_memory.c */
int cuDeviceTotalMem(size_t* bytes, int device) {
    (void)device;
    *bytes = device_limit;
    return SUCCESS;
}

int cuDeviceGetUuid(unsigned char* uuid, int device) {
    for (int i = 0; i < 16; i++) uuid[i] = (unsigned char)(0xa0 + i + 16 * device);
    return SUCCESS;
}

int cuDeviceGetPCIBusId(char* bus, int length, int device) {
    snprintf(bus, (size_t)length, "0000:%02x:00.0", 0x10 + device);
    return SUCCESS;
}

int cuDeviceGetAttribute(int* value, int attribute, int device) {
    switch (attribute) {
    case 1: *value = 1024; break;                  /* max threads per block */
    case 2: case 3: *value = 1024; break;          /* max block dims x, y */
    case 4: *value = 64; break;                    /* max block dim z */
    case 5: *value = 2147483647; break;            /* max grid dim x */
    case 6: case 7: *value = 65535; break;         /* max grid dims y, z */
    case 8: *value = 49152; break;                 /* shared memory per block */
    case 9: *value = 65536; break;                 /* constant memory */
    case 10: *value = 32; break;                   /* warp size */
    case 12: *value = 65536; break;                /* registers per block */
    case 13: *value = 1980000; break;              /* clock rate, kHz */
    case 16: *value = 132; break;                  /* multiprocessors */
    case 19: case 31: case 41: *value = 1; break;  /* map host memory, concurrent kernels, UVA */
    case 33: *value = 0x10 + device; break;        /* PCI bus id */
    case 36: *value = 2619000; break;              /* memory clock, kHz */
    case 37: *value = 5120; break;                 /* memory bus width */
    case 38: *value = 50 << 20; break;             /* L2 cache */
    case 39: *value = 2048; break;                 /* threads per multiprocessor */
    case 40: *value = 3; break;                    /* copy engines */
    case 75: *value = 9; break;                    /* compute capability major */
    case 76: *value = 0; break;                    /* and minor */
    case 83: case 89: *value = 1; break;           /* managed memory, concurrent access */
    case 97: *value = 232448; break;               /* shared memory per block, opt-in */
    case 115: *value = 1; break;                   /* memory pools */
    default: *value = 0; break;
    }
    return SUCCESS;
}

/* Two devices may access each other's memory, unless $FAKE_CUDA_NO_PEER is set (then copies
 * between them are staged, as between GPUs without a peer link). */
int cuDeviceCanAccessPeer(int* can, int device, int peer) {
    const char* none = getenv("FAKE_CUDA_NO_PEER");
    *can = device != peer && !(none && *none && strcmp(none, "0") != 0);
    return SUCCESS;
}

int cuDevicePrimaryCtxRetain(void** context, int device) {
    contexts[device].device = device;
    contexts[device].retained++;
    *context = &contexts[device];
    return SUCCESS;
}

int cuDevicePrimaryCtxRelease(int device) {
    if (contexts[device].retained > 0) contexts[device].retained--;
    return SUCCESS;
}

int cuDevicePrimaryCtxGetState(int device, unsigned int* flags, int* active) {
    *flags = 0;
    *active = contexts[device].retained > 0;
    return SUCCESS;
}

int cuCtxGetCurrent(void** context) {
    *context = ctx_depth ? ctx_stack[ctx_depth - 1] : NULL;
    return SUCCESS;
}

int cuCtxSetCurrent(void* context) {
    if (context == NULL) {
        if (ctx_depth) ctx_depth--;
        return SUCCESS;
    }
    if (ctx_depth == 0) ctx_depth = 1;
    ctx_stack[ctx_depth - 1] = context;
    return SUCCESS;
}

int cuCtxPushCurrent(void* context) {
    if (ctx_depth >= 16) return INVALID_VALUE;
    ctx_stack[ctx_depth++] = context;
    return SUCCESS;
}

int cuCtxPopCurrent(void** context) {
    if (context) *context = ctx_depth ? ctx_stack[ctx_depth - 1] : NULL;
    if (ctx_depth) ctx_depth--;
    return SUCCESS;
}

/* A context of its own, made current (pushed), as cuCtxCreate does; *params* is ignored. */
int cuCtxCreate(void** context, void* params, unsigned int flags, int device) {
    (void)params;
    (void)flags;
    if (device < 0 || device >= device_count()) return INVALID_DEVICE;
    if (ctx_depth >= 16) return INVALID_VALUE;
    pthread_mutex_lock(&created_mutex);
    int i = 0;
    while (i < 8 && created_used[i]) i++;
    if (i == 8) {
        pthread_mutex_unlock(&created_mutex);
        return OUT_OF_MEMORY;
    }
    created_used[i] = 1;
    created[i].device = device;
    created[i].retained = 1;
    pthread_mutex_unlock(&created_mutex);
    *context = &created[i];
    ctx_stack[ctx_depth++] = &created[i];
    return SUCCESS;
}

/* Destroy a context of cuCtxCreate; popped off the calling thread's stack if current there. */
int cuCtxDestroy(void* context) {
    fake_context* c = context;
    if (c < created || c >= created + 8) return INVALID_CONTEXT;
    if (ctx_depth && ctx_stack[ctx_depth - 1] == context) ctx_depth--;
    pthread_mutex_lock(&created_mutex);
    created_used[c - created] = 0;
    pthread_mutex_unlock(&created_mutex);
    return SUCCESS;
}

int cuCtxGetDevice(int* device) {
    if (!ctx_depth || ctx_stack[ctx_depth - 1] == NULL) return INVALID_CONTEXT;
    *device = ((fake_context*)ctx_stack[ctx_depth - 1])->device;
    return SUCCESS;
}

int cuCtxGetId(void* context, unsigned long long* id) {
    fake_context* c = context;
    if (c == NULL) *id = 0;
    else if (c >= created && c < created + 8) *id = 100 + (unsigned long long)(c - created);
    else *id = (unsigned long long)(c - contexts) + 1;
    return SUCCESS;
}

int cuCtxGetApiVersion(void* context, unsigned int* version) {
    (void)context;
    *version = 13000;
    return SUCCESS;
}

int cuCtxGetFlags(unsigned int* flags) { *flags = 0; return SUCCESS; }
int cuCtxGetStreamPriorityRange(int* least, int* greatest) {
    *least = 0;
    *greatest = -5;
    return SUCCESS;
}
int cuCtxSynchronize(void) {
    need_context("cuCtxSynchronize");
    int forbidden = capture_forbids(NULL);
    if (forbidden != SUCCESS) return forbidden;
    ctx_wait(); /* the deferred mode: every queue runs */
    return sticky;
}

static const char* error_name(int code) {
    switch (code) {
    case SUCCESS: return "CUDA_SUCCESS";
    case INVALID_VALUE: return "CUDA_ERROR_INVALID_VALUE";
    case OUT_OF_MEMORY: return "CUDA_ERROR_OUT_OF_MEMORY";
    case INVALID_DEVICE: return "CUDA_ERROR_INVALID_DEVICE";
    case INVALID_CONTEXT: return "CUDA_ERROR_INVALID_CONTEXT";
    case NOT_FOUND: return "CUDA_ERROR_NOT_FOUND";
    case NOT_READY: return "CUDA_ERROR_NOT_READY";
    case ILLEGAL_ADDRESS: return "CUDA_ERROR_ILLEGAL_ADDRESS";
    case NOT_SUPPORTED: return "CUDA_ERROR_NOT_SUPPORTED";
    case ILLEGAL_STATE: return "CUDA_ERROR_ILLEGAL_STATE";
    case CAPTURE_UNSUPPORTED: return "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED";
    case CAPTURE_INVALIDATED: return "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED";
    case CAPTURE_MERGE: return "CUDA_ERROR_STREAM_CAPTURE_MERGE";
    case CAPTURE_UNMATCHED: return "CUDA_ERROR_STREAM_CAPTURE_UNMATCHED";
    case CAPTURE_WRONG_THREAD: return "CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD";
    case GRAPH_EXEC_UPDATE_FAILURE: return "CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE";
    default: return "CUDA_ERROR_UNKNOWN";
    }
}

int cuGetErrorName(int code, const char** name) { *name = error_name(code); return SUCCESS; }
int cuGetErrorString(int code, const char** text) { *text = error_name(code); return SUCCESS; }

/* NVRTC asks libcuda.so.1 for its private export tables; the stand-in has none, and NVRTC
 * compiles without them. */
int cuGetExportTable(const void** table, const void* id) {
    (void)id;
    *table = NULL;
    return NOT_FOUND;
}
