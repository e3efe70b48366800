/* The stand-in's memory and streams (included by fake_cuda.c).
 *
 * Device memory is host memory: device pointers are real addresses, so copies and memsets are
 * memcpy and memset. In the immediate mode (the default) they are done at once when enqueued:
 * every stream runs eagerly in enqueue order, so stream order and the waits between streams
 * hold by construction. In the deferred mode they wait in their stream's queue
 * (fake_streams.c). A capturing stream's copies and memsets become graph nodes instead
 * (fake_graphs.c). Memory pools hand out host allocations too and count their bytes;
 * allocations are kept in a registry that answers cuPointerGetAttribute(s) and
 * fake_live_allocations(). The device has 80 GiB unless fake_set_device_memory() says
 * otherwise: an allocation past it fails with CUDA_ERROR_OUT_OF_MEMORY, and cuMemGetInfo
 * answers what is left.
 */

typedef struct {
    uintptr_t ptr;
    size_t size;
    int type; /* 1: pinned host, 2: device */
    void* pool;
} fake_allocation;

typedef struct {
    size_t used;
    size_t used_high;
    unsigned long long threshold;
    unsigned int access; /* bit d: device d was given read-write access (cuMemPoolSetAccess) */
} fake_pool;

struct fake_op;
typedef struct fake_stream {
    unsigned int flags;
    int priority;
    unsigned long long id;
    void* context; /* the context current when it was made (the first primary one if none) */
    /* While it takes part in a capture (under graph_mutex, fake_graphs.c): the capture, and the
     * nodes its next work depends on. */
    void* capture;
    void* tail[MAX_TAIL];
    size_t n_tail;
    /* The deferred mode's queue (under queue_mutex, fake_streams.c), and the live streams. */
    struct fake_op* head;
    struct fake_op* last;
    struct fake_stream* next_live;
    struct fake_stream* prev_live;
} fake_stream;

/* A call on *stream* needs its context current (a default stream: a primary one). Handles
 * below 0x10000 are special streams, or made-up ones of tests: no objects of ours. */
static void need_stream_context(void* stream, const char* call) {
    need_context(call);
    if ((uintptr_t)stream >= 0x10000 && ((fake_stream*)stream)->context != current_context())
        wrong(call);
}

static pthread_mutex_t memory_mutex = PTHREAD_MUTEX_INITIALIZER;
static fake_allocation* allocations;
static size_t n_allocations, room_allocations;
static long live_streams, live_pools;
static unsigned long long next_stream_id = 1;
static fake_pool default_pools[8];
static size_t device_bytes;                    /* live device allocations (type 2) */
static unsigned long long device_limit = 80ULL << 30; /* fake_set_device_memory() */

/* The device's memory: *bytes* in all (cuDeviceTotalMem, cuMemGetInfo), allocations past it
 * failing with CUDA_ERROR_OUT_OF_MEMORY. */
void fake_set_device_memory(unsigned long long bytes) { device_limit = bytes; }

static void* fake_allocate(size_t size, int type, void* pool) {
    if (type == 2) {
        pthread_mutex_lock(&memory_mutex);
        int room = device_bytes + size <= device_limit;
        pthread_mutex_unlock(&memory_mutex);
        if (!room) return NULL;
    }
    size_t rounded = ((size ? size : 1) + 255) & ~(size_t)255;
    void* ptr = aligned_alloc(4096, (rounded + 4095) & ~(size_t)4095);
    if (ptr == NULL) return NULL;
    pthread_mutex_lock(&memory_mutex);
    if (n_allocations == room_allocations) {
        room_allocations = room_allocations ? 2 * room_allocations : 256;
        allocations = realloc(allocations, room_allocations * sizeof *allocations);
    }
    allocations[n_allocations++] = (fake_allocation){(uintptr_t)ptr, size, type, pool};
    if (type == 2) device_bytes += size;
    if (pool) {
        fake_pool* p = pool;
        p->used += size;
        if (p->used > p->used_high) p->used_high = p->used;
    }
    pthread_mutex_unlock(&memory_mutex);
    return ptr;
}

static int fake_release(uintptr_t ptr, int type) {
    if (ptr == 0) return SUCCESS; /* freeing NULL does nothing, as in the driver */
    pthread_mutex_lock(&memory_mutex);
    for (size_t i = 0; i < n_allocations; i++) {
        if (allocations[i].ptr == ptr && allocations[i].type == type) {
            fake_pool* pool = allocations[i].pool;
            if (pool) pool->used -= allocations[i].size;
            if (type == 2) device_bytes -= allocations[i].size;
            allocations[i] = allocations[--n_allocations];
            pthread_mutex_unlock(&memory_mutex);
            free((void*)ptr);
            return SUCCESS;
        }
    }
    pthread_mutex_unlock(&memory_mutex);
    return INVALID_VALUE;
}

/* The allocation holding *ptr* (a copy; type 0 if none). */
static fake_allocation fake_find(uintptr_t ptr) {
    fake_allocation found = {0, 0, 0, NULL};
    pthread_mutex_lock(&memory_mutex);
    for (size_t i = 0; i < n_allocations; i++) {
        if (ptr >= allocations[i].ptr && ptr < allocations[i].ptr + (allocations[i].size ? allocations[i].size : 1)) {
            found = allocations[i];
            break;
        }
    }
    pthread_mutex_unlock(&memory_mutex);
    return found;
}

/* How many device and pinned allocations are live, and streams and pools (for leak tests). */
long fake_live_allocations(void) {
    pthread_mutex_lock(&memory_mutex);
    long n = (long)n_allocations;
    pthread_mutex_unlock(&memory_mutex);
    return n;
}
/* How many allocations of *type* (1: pinned host, 2: device) are live, and their bytes. */
long fake_live_allocations_of(int type, unsigned long long* bytes) {
    long n = 0;
    unsigned long long total = 0;
    pthread_mutex_lock(&memory_mutex);
    for (size_t i = 0; i < n_allocations; i++) {
        if (allocations[i].type == type) {
            n++;
            total += allocations[i].size;
        }
    }
    pthread_mutex_unlock(&memory_mutex);
    if (bytes) *bytes = total;
    return n;
}
long fake_live_streams(void) { return live_streams; }
long fake_live_pools(void) { return live_pools; }

int cuMemAlloc(uintptr_t* ptr, size_t size) {
    need_context("cuMemAlloc");
    POISONED();
    INJECTED(alloc);
    void* p = fake_allocate(size, 2, NULL);
    if (p == NULL) return OUT_OF_MEMORY;
    *ptr = (uintptr_t)p;
    return SUCCESS;
}
int cuMemFree(uintptr_t ptr) {
    if (sticky != SUCCESS) return sticky;
    freeing(ptr, "cuMemFree");
    return fake_release(ptr, 2);
}

int cuMemHostAlloc(void** ptr, size_t size, unsigned int flags) {
    need_context("cuMemHostAlloc");
    POISONED();
    (void)flags;
    *ptr = fake_allocate(size, 1, NULL);
    return *ptr ? SUCCESS : OUT_OF_MEMORY;
}
int cuMemAllocHost(void** ptr, size_t size) { return cuMemHostAlloc(ptr, size, 0); }
int cuMemFreeHost(void* ptr) {
    if (sticky != SUCCESS) return sticky;
    freeing((uintptr_t)ptr, "cuMemFreeHost");
    return fake_release((uintptr_t)ptr, 1);
}

/* What the device has free, and in all (fake_set_device_memory). */
int cuMemGetInfo(size_t* free_bytes, size_t* total) {
    need_context("cuMemGetInfo");
    POISONED();
    pthread_mutex_lock(&memory_mutex);
    *total = device_limit;
    *free_bytes = device_bytes < device_limit ? device_limit - device_bytes : 0;
    pthread_mutex_unlock(&memory_mutex);
    return SUCCESS;
}
int cuMemHostGetDevicePointer(uintptr_t* device, void* host, unsigned int flags) {
    (void)flags;
    *device = (uintptr_t)host;
    return SUCCESS;
}

int cuMemPoolCreate(void** pool, const void* props) {
    need_context("cuMemPoolCreate");
    (void)props;
    *pool = calloc(1, sizeof(fake_pool));
    __atomic_add_fetch(&live_pools, 1, __ATOMIC_SEQ_CST);
    return SUCCESS;
}
int cuMemPoolDestroy(void* pool) {
    free(pool);
    __atomic_sub_fetch(&live_pools, 1, __ATOMIC_SEQ_CST);
    return SUCCESS;
}
int cuDeviceGetDefaultMemPool(void** pool, int device) { *pool = &default_pools[device]; return SUCCESS; }
int cuDeviceGetMemPool(void** pool, int device) { *pool = &default_pools[device]; return SUCCESS; }
int cuMemPoolTrimTo(void* pool, size_t keep) { (void)pool; (void)keep; return SUCCESS; }

int cuMemPoolSetAttribute(void* handle, int attribute, void* value) {
    fake_pool* pool = handle;
    if (attribute == 4) pool->threshold = *(unsigned long long*)value;
    else if (attribute == 6 || attribute == 8) pool->used_high = pool->used;
    return SUCCESS;
}

int cuMemPoolGetAttribute(void* handle, int attribute, void* value) {
    fake_pool* pool = handle;
    pthread_mutex_lock(&memory_mutex);
    switch (attribute) {
    case 1: case 2: case 3: *(int*)value = 1; break;
    case 4: *(unsigned long long*)value = pool->threshold; break;
    case 5: case 7: *(unsigned long long*)value = pool->used; break; /* nothing is cached */
    case 6: case 8: *(unsigned long long*)value = pool->used_high; break;
    default: *(unsigned long long*)value = 0; break;
    }
    pthread_mutex_unlock(&memory_mutex);
    return SUCCESS;
}

/* Access of other devices to a pool's memory: recorded, and counted (fake_pool_access_grants:
 * grants of read-write access). The map is CUmemAccessDesc: location type and id, then flags. */
typedef struct {
    int location_type, location_id, flags;
} fake_access_desc;
static long pool_access_grants;
long fake_pool_access_grants(void) { return __atomic_load_n(&pool_access_grants, __ATOMIC_SEQ_CST); }
int cuMemPoolSetAccess(void* handle, const void* map, size_t count) {
    POISONED();
    fake_pool* pool = handle;
    const fake_access_desc* desc = map;
    for (size_t i = 0; i < count; i++) {
        int device = desc[i].location_id;
        if (desc[i].location_type != 1 || device < 0 || device >= device_count()) return INVALID_VALUE;
        if (desc[i].flags == 3) { /* CU_MEM_ACCESS_FLAGS_PROT_READWRITE */
            if (!(pool->access & (1u << device))) __atomic_add_fetch(&pool_access_grants, 1, __ATOMIC_SEQ_CST);
            pool->access |= 1u << device;
        } else {
            pool->access &= ~(1u << device);
        }
    }
    return SUCCESS;
}
int cuMemPoolGetAccess(int* flags, void* handle, const int* location) {
    fake_pool* pool = handle;
    int device = location[1];
    if (location[0] != 1 || device < 0 || device >= device_count()) return INVALID_VALUE;
    *flags = (pool->access & (1u << device)) ? 3 : 0;
    return SUCCESS;
}

int cuMemAllocFromPoolAsync(uintptr_t* ptr, size_t size, void* pool, void* stream) {
    need_stream_context(stream, "cuMemAllocFromPoolAsync");
    POISONED();
    int captured = capture_refuses(stream, "cuMemAllocFromPoolAsync");
    if (captured != NOT_CAPTURED) return captured;
    INJECTED(alloc);
    void* p = fake_allocate(size, 2, pool);
    if (p == NULL) return OUT_OF_MEMORY;
    *ptr = (uintptr_t)p;
    return SUCCESS;
}
int cuMemAllocAsync(uintptr_t* ptr, size_t size, void* stream) {
    int captured = capture_refuses(stream, "cuMemAllocAsync");
    if (captured != NOT_CAPTURED) return captured;
    return cuMemAllocFromPoolAsync(ptr, size, &default_pools[0], stream);
}
/* After a sticky fault device memory cannot be freed any more: it goes with the context. */
int cuMemFreeAsync(uintptr_t ptr, void* stream) {
    need_stream_context(stream, "cuMemFreeAsync");
    int captured = capture_refuses(stream, "cuMemFreeAsync");
    if (captured != NOT_CAPTURED) return captured;
    if (sticky != SUCCESS) return sticky;
    int queued = defer_free(stream, ptr); /* the deferred mode: when the stream gets there */
    return queued != NOT_DEFERRED ? queued : fake_release(ptr, 2);
}

int cuMemcpy(uintptr_t dst, uintptr_t src, size_t n) { memcpy((void*)dst, (void*)src, n); return SUCCESS; }
/* The asynchronous copies and memsets: graph nodes on a capturing stream, queued in the
 * deferred mode, else done now. */
static int copy_async(uintptr_t dst, uintptr_t src, size_t n, void* s) {
    need_stream_context(s, "cuMemcpy*Async");
    POISONED();
    INJECTED(copy);
    int captured = capture_copy(s, dst, src, n);
    if (captured != NOT_CAPTURED) return captured;
    int queued = defer_copy(s, dst, src, n);
    return queued != NOT_DEFERRED ? queued : cuMemcpy(dst, src, n);
}
int cuMemcpyAsync(uintptr_t dst, uintptr_t src, size_t n, void* s) { return copy_async(dst, src, n, s); }
int cuMemcpyHtoD(uintptr_t dst, const void* src, size_t n) { return cuMemcpy(dst, (uintptr_t)src, n); }
int cuMemcpyDtoH(void* dst, uintptr_t src, size_t n) { return cuMemcpy((uintptr_t)dst, src, n); }
int cuMemcpyDtoD(uintptr_t dst, uintptr_t src, size_t n) { return cuMemcpy(dst, src, n); }
int cuMemcpyHtoDAsync(uintptr_t dst, const void* src, size_t n, void* s) { return copy_async(dst, (uintptr_t)src, n, s); }
int cuMemcpyDtoHAsync(void* dst, uintptr_t src, size_t n, void* s) { return copy_async((uintptr_t)dst, src, n, s); }
int cuMemcpyDtoDAsync(uintptr_t dst, uintptr_t src, size_t n, void* s) { return copy_async(dst, src, n, s); }
/* Between contexts: one address space, so a copy as any other (counted: fake_peer_copies). */
static long peer_copies;
long fake_peer_copies(void) { return __atomic_load_n(&peer_copies, __ATOMIC_SEQ_CST); }
int cuMemcpyPeerAsync(uintptr_t dst, void* dst_ctx, uintptr_t src, void* src_ctx, size_t n, void* s) {
    if (dst_ctx == NULL || src_ctx == NULL) return INVALID_CONTEXT;
    __atomic_add_fetch(&peer_copies, 1, __ATOMIC_SEQ_CST);
    return copy_async(dst, src, n, s);
}
int cuMemcpyPeer(uintptr_t dst, void* dst_ctx, uintptr_t src, void* src_ctx, size_t n) {
    if (dst_ctx == NULL || src_ctx == NULL) return INVALID_CONTEXT;
    return cuMemcpy(dst, src, n);
}
/* Peer access of the current context to *peer*'s memory, once (fake_peer_enables). */
static long peer_enables;
long fake_peer_enables(void) { return __atomic_load_n(&peer_enables, __ATOMIC_SEQ_CST); }
int cuCtxEnablePeerAccess(void* peer, unsigned int flags) {
    (void)flags;
    need_context("cuCtxEnablePeerAccess");
    if (peer == NULL || peer == current_context()) return INVALID_VALUE;
    __atomic_add_fetch(&peer_enables, 1, __ATOMIC_SEQ_CST);
    return SUCCESS;
}

int cuMemsetD8(uintptr_t dst, unsigned char value, size_t n) { memset((void*)dst, value, n); return SUCCESS; }
int cuMemsetD8Async(uintptr_t dst, unsigned char value, size_t n, void* s) {
    need_stream_context(s, "cuMemsetD8Async");
    POISONED();
    int captured = capture_memset(s, dst, value, 1, n);
    if (captured != NOT_CAPTURED) return captured;
    int queued = defer_memset(s, dst, value, 1, n);
    return queued != NOT_DEFERRED ? queued : cuMemsetD8(dst, value, n);
}
int cuMemsetD32(uintptr_t dst, unsigned int value, size_t n) {
    for (size_t i = 0; i < n; i++) ((unsigned int*)dst)[i] = value;
    return SUCCESS;
}
int cuMemsetD32Async(uintptr_t dst, unsigned int value, size_t n, void* s) {
    need_stream_context(s, "cuMemsetD32Async");
    POISONED();
    int captured = capture_memset(s, dst, value, 4, n);
    if (captured != NOT_CAPTURED) return captured;
    int queued = defer_memset(s, dst, value, 4, n);
    return queued != NOT_DEFERRED ? queued : cuMemsetD32(dst, value, n);
}

static int pointer_attribute(void* data, int attribute, uintptr_t ptr) {
    fake_allocation found = fake_find(ptr);
    switch (attribute) {
    case 1: *(void**)data = &contexts[0]; break;
    case 2: *(unsigned int*)data = found.type == 1 ? 1 : (found.type == 2 ? 2 : 0); break;
    case 3: case 4: *(uintptr_t*)data = ptr; break;
    case 8: case 10: case 13: case 15: *(int*)data = attribute == 13 && found.type; break;
    case 9: *(int*)data = 0; break;
    case 11: *(uintptr_t*)data = found.ptr; break;
    case 12: *(size_t*)data = found.size; break;
    case 16: *(int*)data = 3; break;
    case 17: *(void**)data = found.pool; break;
    default: *(unsigned long long*)data = 0; break;
    }
    return found.type || attribute == 2 ? SUCCESS : INVALID_VALUE;
}

int cuPointerGetAttribute(void* data, int attribute, uintptr_t ptr) {
    return pointer_attribute(data, attribute, ptr);
}

int cuPointerGetAttributes(unsigned int count, int* attributes, void** data, uintptr_t ptr) {
    for (unsigned int i = 0; i < count; i++) pointer_attribute(data[i], attributes[i], ptr);
    return SUCCESS;
}

int cuStreamCreateWithPriority(void** stream, unsigned int flags, int priority) {
    need_context("cuStreamCreate");
    POISONED();
    fake_stream* s = calloc(1, sizeof *s);
    s->flags = flags;
    s->priority = priority;
    s->id = __atomic_fetch_add(&next_stream_id, 1, __ATOMIC_SEQ_CST);
    s->context = ctx_depth && ctx_stack[ctx_depth - 1] ? ctx_stack[ctx_depth - 1] : &contexts[0];
    __atomic_add_fetch(&live_streams, 1, __ATOMIC_SEQ_CST);
    streams_add(s);
    *stream = s;
    return SUCCESS;
}
int cuStreamCreate(void** stream, unsigned int flags) { return cuStreamCreateWithPriority(stream, flags, 0); }
int cuStreamDestroy(void* stream) {
    if (stream) {
        capture_forget_stream(stream);
        streams_remove(stream); /* after what is queued on it ran */
        /* In the deferred mode a thread may still be in its queue's run, waiting for a long
         * kernel or an event with the queue's lock let go: the stream is kept, empty. */
        if (!deferred()) free(stream);
        __atomic_sub_fetch(&live_streams, 1, __ATOMIC_SEQ_CST);
    }
    return SUCCESS;
}
/* The legacy (0), per-thread (2) and other special streams are no objects of ours. */
static int is_special(void* stream) { return (uintptr_t)stream < 0x1000; }
int cuStreamGetFlags(void* stream, unsigned int* flags) { *flags = is_special(stream) ? 0 : ((fake_stream*)stream)->flags; return SUCCESS; }
int cuStreamGetPriority(void* stream, int* priority) { *priority = is_special(stream) ? 0 : ((fake_stream*)stream)->priority; return SUCCESS; }
int cuStreamGetId(void* stream, unsigned long long* id) { *id = is_special(stream) ? (uintptr_t)stream : ((fake_stream*)stream)->id; return SUCCESS; }
int cuStreamGetCtx(void* stream, void** context) {
    if (!is_special(stream)) {
        *context = ((fake_stream*)stream)->context;
        return SUCCESS;
    }
    if (!ctx_depth || ctx_stack[ctx_depth - 1] == NULL) return INVALID_CONTEXT;
    *context = ctx_stack[ctx_depth - 1]; /* a default stream: the current context's */
    return SUCCESS;
}
int cuStreamGetDevice(void* stream, int* device) { (void)stream; *device = 0; return SUCCESS; }
/* In the immediate mode every stream ran its work already: synchronizations and queries
 * answer at once, and a wait does nothing, unless a capture is concerned. In the deferred mode
 * they run the stream's queue, or wait for it (fake_streams.c). */
int cuStreamSynchronize(void* stream) {
    int forbidden = capture_forbids(stream);
    if (forbidden != SUCCESS) return forbidden;
    INJECTED(sync);
    return queued_stream(stream) ? stream_wait(stream, 1) : sticky;
}
int cuStreamQuery(void* stream) {
    int forbidden = capture_forbids(stream);
    if (forbidden != SUCCESS) return forbidden;
    return queued_stream(stream) ? stream_wait(stream, 0) : sticky;
}
int cuStreamWaitEvent(void* stream, void* event, unsigned int flags) {
    need_stream_context(stream, "cuStreamWaitEvent");
    POISONED();
    __atomic_add_fetch(&wait_calls, 1, __ATOMIC_SEQ_CST);
    int captured = capture_wait(stream, event, flags);
    if (captured != NOT_CAPTURED) return captured;
    int queued = defer_wait(stream, event);
    return queued != NOT_DEFERRED ? queued : SUCCESS;
}
