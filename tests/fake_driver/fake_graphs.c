/* The stand-in's stream capture and CUDA graphs (included by fake_cuda.c).
 *
 * While a stream captures (cuStreamBeginCapture), the work enqueued on it does not run: it
 * becomes a node of the capture's graph. Copies, memsets and kernel launches make nodes; a
 * kernel node keeps a copy of its parameter values (the kernelParams pointers are only valid
 * during the call), by the sizes fake_modules.c's param_sizes() knows, else as cuLaunchKernel
 * keeps them: fake_expect_params() slots of 16 bytes. An event recorded on a capturing stream
 * marks where that stream is, and a stream that waits for it joins the capture there (fork and
 * join); recorded with CU_EVENT_RECORD_EXTERNAL or waited for with CU_EVENT_WAIT_EXTERNAL, it
 * makes an event node. cuStreamEndCapture hands the graph out. Graphs can be built with
 * cuGraphAdd*Node too.
 *
 * A graph's nodes are kept in the order they were added, which respects their dependencies (a
 * node depends on nodes added before it). An executable graph (cuGraphInstantiate) is a copy
 * of them that remembers which node each copies; cuGraphLaunch runs them in that order, at
 * once, on the host, as the stand-in runs all work, so an event recorded after the launch
 * completes as FAKE_CUDA_COMPLETE says. cuGraphExecKernelNodeSetParams, cuGraphExecNodeSetParams
 * and cuGraphExecUpdate change the copy, for the next launches.
 *
 * Calls a capture does not allow (event queries and synchronizations, stream and context
 * synchronizations: capture_forbids) fail with CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED and
 * invalidate the captures they conflict with, by the driver's rules: a thread whose mode
 * (cuThreadExchangeStreamCaptureMode) is not relaxed may not make them during its own capture
 * begun in a mode other than relaxed, nor, if its mode is global, during another thread's global
 * capture; and nobody may query or synchronize a capturing stream. Work enqueued on an
 * invalidated capture fails with CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, and so does its end.
 *
 * Not emulated: child graph, host, memory allocation and conditional nodes, stream-ordered
 * allocations and graph launches on a capturing stream (they fail, saying so on stderr), and
 * 2D or 3D memcpy nodes.
 *
 * User objects (cuUserObjectCreate) are counted references; graphs hold them, and so does an
 * executable graph its graph's; the destructor runs at once when the last reference goes, on the
 * thread that let go of it (the driver's runs on a thread of its own, later).
 *
 * Graphs and executable graphs are kept in a list of live ones, so a handle destroyed twice is
 * answered CUDA_ERROR_INVALID_VALUE rather than freed twice (asyncgraph's capture guard and
 * cuda.core's graph builder both destroy the graph of a capture that ended in an error).
 *
 * One mutex (graph_mutex) guards the captures, the capture state of streams and events, the
 * graphs and the executable graphs; a launch runs its nodes holding it, so updates and
 * launches of one executable graph from several threads take turns.
 */

enum { NODE_KERNEL = 0, NODE_MEMCPY = 1, NODE_MEMSET = 2, NODE_EMPTY = 5, NODE_WAIT = 6,
       NODE_RECORD = 7 };
enum { MODE_GLOBAL = 0, MODE_THREAD_LOCAL = 1, MODE_RELAXED = 2 }; /* CUstreamCaptureMode */
enum { STATUS_NONE = 0, STATUS_ACTIVE = 1, STATUS_INVALIDATED = 2 }; /* CUstreamCaptureStatus */

#define MAX_PARAMS 64 /* parameter slots a kernel node keeps: as many as cuLaunchKernel reads */
#define SLOT 16       /* bytes a parameter slot holds */

typedef struct fake_graph fake_graph;
typedef struct fake_node fake_node;

struct fake_node {
    int type;                  /* a CUgraphNodeType: NODE_* */
    fake_graph* graph;         /* the graph holding it */
    fake_node** deps;          /* the nodes it depends on (added before it) */
    size_t n_deps;
    /* a kernel: the function, grid and block (x, y, z) and shared memory bytes, and the values
     * of its parameters, in MAX_PARAMS slots (params: NULL when launched without kernelParams) */
    void* func;
    unsigned int dims[7];
    unsigned char* values;
    void** params;
    /* a 1D copy of *bytes* from *src* to *dst*, or a memset of *height* rows of *width*
     * elements of *element* bytes, *pitch* bytes apart, to *value* */
    uintptr_t dst, src;
    size_t bytes, width, height, pitch;
    unsigned int value, element;
    /* an event record or wait */
    void* event;
    /* in an executable graph: the graph's node it copies, and that of the graph of the last
     * cuGraphExecUpdate (compared, never dereferenced: the graph may be gone) */
    const fake_node* origin;
    const fake_node* updated_from;
};

/* A user object (cuUserObjectCreate): *destroy(ptr)* runs when its last reference goes. */
typedef struct {
    void* ptr;
    void (*destroy)(void*);
    unsigned int refs; /* atomic */
} fake_user_object;

struct fake_graph {
    fake_node** nodes; /* in the order they were added */
    size_t n, room;
    unsigned long long id;
    /* the user objects it holds references to, and how many (an executable graph holds its
     * graph's too, as the driver's do) */
    fake_user_object** held;
    unsigned int* held_refs;
    size_t n_held;
    int executable;
    struct fake_graph* next; /* every live graph and executable graph */
};

typedef struct fake_capture {
    unsigned long long id;
    int mode;               /* the CUstreamCaptureMode it was begun in */
    int invalidated;
    pthread_t thread;       /* the thread that began it */
    fake_graph* graph;      /* what it records into */
    int own_graph;          /* made by cuStreamBeginCapture (not ...ToGraph): freed if it fails */
    fake_stream* origin;    /* the stream it was begun on, which ends it */
    fake_stream* members[32]; /* every stream taking part (the origin first) */
    int n_members;
    struct fake_capture* next;
} fake_capture;

static pthread_mutex_t graph_mutex = PTHREAD_MUTEX_INITIALIZER;
static fake_capture* captures;         /* the captures under way */
static fake_graph* all_graphs;         /* every live graph and executable graph */
static int active_captures;            /* how many: read without the lock, for the fast path */
static unsigned long long next_capture_id = 1, next_graph_id = 1; /* under graph_mutex */
static long live_graphs, live_execs;
static __thread int thread_mode = MODE_GLOBAL; /* cuThreadExchangeStreamCaptureMode */
static const unsigned char no_edge_data[8 * MAX_TAIL]; /* CUgraphEdgeData: all default edges */

static long refused_destroys; /* cuGraphDestroy of a graph destroyed already */

/* How many graphs and executable graphs are not destroyed (for leak tests), and how many
 * destroys named a graph destroyed already (a double free on a real driver). */
long fake_live_graphs(void) { return __atomic_load_n(&live_graphs, __ATOMIC_SEQ_CST); }
long fake_refused_graph_destroys(void) { return __atomic_load_n(&refused_destroys, __ATOMIC_SEQ_CST); }
long fake_live_graph_execs(void) { return __atomic_load_n(&live_execs, __ATOMIC_SEQ_CST); }

/* -- graphs and nodes ------------------------------------------------------------------------ */

/* A new graph (an executable one if *executable*), graph_mutex held. */
static fake_graph* graph_new(int executable) {
    fake_graph* graph = calloc(1, sizeof *graph);
    graph->id = next_graph_id++;
    graph->executable = executable;
    graph->next = all_graphs;
    all_graphs = graph;
    __atomic_add_fetch(executable ? &live_execs : &live_graphs, 1, __ATOMIC_SEQ_CST);
    return graph;
}

/* Take *graph* (executable if *executable*) out of the live ones, graph_mutex held; whether
 * it was one. A handle destroyed twice is refused, not freed twice. */
static int graph_unlink(fake_graph* graph, int executable) {
    for (fake_graph** at = &all_graphs; *at; at = &(*at)->next) {
        if (*at == graph && graph->executable == executable) {
            *at = graph->next;
            __atomic_sub_fetch(executable ? &live_execs : &live_graphs, 1, __ATOMIC_SEQ_CST);
            return 1;
        }
    }
    return 0;
}

static void node_free(fake_node* node) {
    free(node->deps);
    free(node->values);
    free(node->params);
    free(node);
}

static void user_object_release(fake_user_object* object, unsigned int count) {
    if (__atomic_sub_fetch(&object->refs, count, __ATOMIC_ACQ_REL) == 0) {
        object->destroy(object->ptr);
        free(object);
    }
}

/* Free *graph* (graph_mutex not held: the user objects it lets go of may run their destructors,
 * which may call back into Python). */
static void graph_free(fake_graph* graph) {
    for (size_t i = 0; i < graph->n; i++) node_free(graph->nodes[i]);
    free(graph->nodes);
    for (size_t i = 0; i < graph->n_held; i++)
        user_object_release(graph->held[i], graph->held_refs[i]);
    free(graph->held);
    free(graph->held_refs);
    free(graph);
}

/* *graph* holds *count* more references to *object* (graph_mutex held). */
static void graph_hold(fake_graph* graph, fake_user_object* object, unsigned int count) {
    for (size_t i = 0; i < graph->n_held; i++) {
        if (graph->held[i] == object) {
            graph->held_refs[i] += count;
            return;
        }
    }
    graph->held = realloc(graph->held, (graph->n_held + 1) * sizeof *graph->held);
    graph->held_refs = realloc(graph->held_refs, (graph->n_held + 1) * sizeof *graph->held_refs);
    graph->held[graph->n_held] = object;
    graph->held_refs[graph->n_held++] = count;
}

/* A new node of *type* in *graph*, depending on *deps*. */
static fake_node* node_add(fake_graph* graph, int type, fake_node* const* deps, size_t n_deps) {
    fake_node* node = calloc(1, sizeof *node);
    node->type = type;
    node->graph = graph;
    if (n_deps) {
        node->deps = malloc(n_deps * sizeof *node->deps);
        memcpy(node->deps, deps, n_deps * sizeof *node->deps);
        node->n_deps = n_deps;
    }
    if (graph->n == graph->room) {
        graph->room = graph->room ? 2 * graph->room : 16;
        graph->nodes = realloc(graph->nodes, graph->room * sizeof *graph->nodes);
    }
    graph->nodes[graph->n++] = node;
    return node;
}

/* Keep the values *params* points to in kernel node *node* (see the top of this file); its
 * function and dimensions are set. */
static void keep_params(fake_node* node, void** params) {
    free(node->values);
    free(node->params);
    node->values = NULL;
    node->params = NULL;
    if (params == NULL) return;
    size_t sizes[MAX_PARAMS];
    int n = node->func ? param_sizes(node->func, sizes) : -1;
    if (n < 0) {
        n = param_count;
        for (int i = 0; i < n; i++) sizes[i] = SLOT;
    }
    node->values = calloc(MAX_PARAMS, SLOT);
    node->params = malloc(MAX_PARAMS * sizeof(void*));
    for (int i = 0; i < MAX_PARAMS; i++) {
        node->params[i] = node->values + SLOT * i;
        if (i < n) memcpy(node->params[i], params[i], sizes[i]);
    }
}

/* Give node *to* the parameters of node *from*, of the same type. */
static void node_assign(fake_node* to, const fake_node* from) {
    to->func = from->func;
    memcpy(to->dims, from->dims, sizeof to->dims);
    to->dst = from->dst;
    to->src = from->src;
    to->bytes = from->bytes;
    to->width = from->width;
    to->height = from->height;
    to->pitch = from->pitch;
    to->value = from->value;
    to->element = from->element;
    to->event = from->event;
    if (from->params) {
        if (to->params == NULL) {
            to->values = malloc(MAX_PARAMS * SLOT);
            to->params = malloc(MAX_PARAMS * sizeof(void*));
            for (int i = 0; i < MAX_PARAMS; i++) to->params[i] = to->values + SLOT * i;
        }
        memcpy(to->values, from->values, MAX_PARAMS * SLOT);
    } else {
        free(to->values);
        free(to->params);
        to->values = NULL;
        to->params = NULL;
    }
}

/* A copy of *node* (its dependencies left out) in *graph*: an executable graph's. */
static fake_node* node_copy(fake_graph* graph, const fake_node* node) {
    fake_node* copy = node_add(graph, node->type, NULL, 0);
    node_assign(copy, node);
    copy->origin = node;
    return copy;
}

static void run_memset(const fake_node* node) {
    for (size_t row = 0; row < (node->height ? node->height : 1); row++) {
        unsigned char* at = (unsigned char*)(node->dst + row * node->pitch);
        if (node->element == 1) {
            memset(at, (int)(node->value & 0xff), node->width);
        } else if (node->element == 2) {
            uint16_t value = (uint16_t)node->value;
            for (size_t i = 0; i < node->width; i++) memcpy(at + 2 * i, &value, 2);
        } else {
            for (size_t i = 0; i < node->width; i++) memcpy(at + 4 * i, &node->value, 4);
        }
    }
}

/* Run *node* now, as part of a launch on *stream*. */
static void run_node(const fake_node* node, void* stream) {
    switch (node->type) {
    case NODE_KERNEL: launch_now(node->func, node->dims, stream, node->params); break;
    case NODE_MEMCPY: memcpy((void*)node->dst, (const void*)node->src, node->bytes); break;
    case NODE_MEMSET: run_memset(node); break;
    case NODE_RECORD: record_now(node->event); break;
    default: break; /* empty, and waits: every stream ran its work already */
    }
}

/* -- capturing ------------------------------------------------------------------------------- */

static fake_capture* capture_of(void* stream) {
    return is_special(stream) ? NULL : ((fake_stream*)stream)->capture;
}

static fake_capture* capture_by_id(unsigned long long id) {
    for (fake_capture* capture = captures; capture; capture = capture->next)
        if (capture->id == id) return capture;
    return NULL;
}

static void join(fake_capture* capture, fake_stream* stream) {
    stream->capture = capture;
    if (capture->n_members < (int)(sizeof capture->members / sizeof capture->members[0]))
        capture->members[capture->n_members++] = stream;
}

/* Take *stream* out of its capture (its end, or the stream destroyed). */
static void leave(fake_stream* stream) {
    fake_capture* capture = stream->capture;
    stream->capture = NULL;
    stream->n_tail = 0;
    if (capture == NULL) return;
    for (int i = 0; i < capture->n_members; i++) {
        if (capture->members[i] == stream) {
            capture->members[i] = capture->members[--capture->n_members];
            break;
        }
    }
    if (capture->origin == stream) capture->origin = NULL;
}

/* A node of *type* at the tail of capturing *stream* (graph_mutex held), which becomes the
 * tail; NULL, with *code* set, when the capture is invalidated. */
static fake_node* captured_node(fake_stream* stream, int type, int* code) {
    fake_capture* capture = stream->capture;
    if (capture->invalidated) {
        *code = CAPTURE_INVALIDATED;
        return NULL;
    }
    fake_node* node =
        node_add(capture->graph, type, (fake_node* const*)stream->tail, stream->n_tail);
    stream->tail[0] = node;
    stream->n_tail = 1;
    *code = SUCCESS;
    return node;
}

static int capture_copy(void* stream, uintptr_t dst, uintptr_t src, size_t n) {
    if (__atomic_load_n(&active_captures, __ATOMIC_ACQUIRE) == 0) return NOT_CAPTURED;
    pthread_mutex_lock(&graph_mutex);
    int code = NOT_CAPTURED;
    if (capture_of(stream)) {
        fake_node* node = captured_node(stream, NODE_MEMCPY, &code);
        if (node) {
            node->dst = dst;
            node->src = src;
            node->bytes = n;
        }
    }
    pthread_mutex_unlock(&graph_mutex);
    return code;
}

static int capture_memset(void* stream, uintptr_t dst, unsigned int value, unsigned int element,
                          size_t n) {
    if (__atomic_load_n(&active_captures, __ATOMIC_ACQUIRE) == 0) return NOT_CAPTURED;
    pthread_mutex_lock(&graph_mutex);
    int code = NOT_CAPTURED;
    if (capture_of(stream)) {
        fake_node* node = captured_node(stream, NODE_MEMSET, &code);
        if (node) {
            node->dst = dst;
            node->value = value;
            node->element = element;
            node->width = n;
            node->height = 1;
            node->pitch = n * element;
        }
    }
    pthread_mutex_unlock(&graph_mutex);
    return code;
}

static int capture_launch(void* stream, void* f, const unsigned int dims[7], void** params) {
    if (__atomic_load_n(&active_captures, __ATOMIC_ACQUIRE) == 0) return NOT_CAPTURED;
    pthread_mutex_lock(&graph_mutex);
    int code = NOT_CAPTURED;
    if (capture_of(stream)) {
        fake_node* node = captured_node(stream, NODE_KERNEL, &code);
        if (node) {
            node->func = f;
            memcpy(node->dims, dims, sizeof node->dims);
            keep_params(node, params);
        }
    }
    pthread_mutex_unlock(&graph_mutex);
    return code;
}

/* An event recorded on a capturing stream marks the stream's tail (with
 * CU_EVENT_RECORD_EXTERNAL, 1, it is an event record node too); recorded elsewhere, it forgets
 * an earlier capture's mark. */
static int capture_record(void* stream, void* handle, unsigned int flags) {
    fake_event* event = handle;
    if (__atomic_load_n(&active_captures, __ATOMIC_ACQUIRE) == 0) {
        if (event->capture_id == 0) return NOT_CAPTURED;
    }
    pthread_mutex_lock(&graph_mutex);
    int code = NOT_CAPTURED;
    fake_capture* capture = capture_of(stream);
    event->capture_id = 0;
    if (capture && capture->invalidated) {
        code = CAPTURE_INVALIDATED;
    } else if (capture) {
        fake_stream* s = stream;
        code = SUCCESS;
        if (flags & 1) {
            fake_node* node = captured_node(s, NODE_RECORD, &code);
            if (node) node->event = event;
        }
        event->capture_id = capture->id;
        memcpy(event->tail, s->tail, s->n_tail * sizeof s->tail[0]);
        event->n_tail = s->n_tail;
    }
    pthread_mutex_unlock(&graph_mutex);
    return code;
}

/* A stream waiting for an event recorded in a capture joins the capture (or, taking part
 * already, depends on the event's mark too); a capturing stream waiting for another event
 * makes an event wait node with CU_EVENT_WAIT_EXTERNAL (1), else waits for nothing. */
static int capture_wait(void* stream, void* handle, unsigned int flags) {
    fake_event* event = handle;
    if (__atomic_load_n(&active_captures, __ATOMIC_ACQUIRE) == 0) return NOT_CAPTURED;
    pthread_mutex_lock(&graph_mutex);
    int code = NOT_CAPTURED;
    fake_capture* capture = capture_of(stream);
    fake_capture* marked = event->capture_id ? capture_by_id(event->capture_id) : NULL;
    fake_stream* s = stream;
    if (capture && capture->invalidated) {
        code = CAPTURE_INVALIDATED;
    } else if (marked && capture && marked != capture) {
        code = CAPTURE_MERGE;
    } else if (marked && is_special(stream)) {
        code = CAPTURE_UNSUPPORTED; /* the legacy stream cannot capture */
    } else if (marked) {
        if (capture == NULL) {
            join(marked, s);
            s->n_tail = 0;
        }
        for (size_t i = 0; i < event->n_tail; i++) {
            size_t j = 0;
            while (j < s->n_tail && s->tail[j] != event->tail[i]) j++;
            if (j == s->n_tail && s->n_tail < MAX_TAIL) s->tail[s->n_tail++] = event->tail[i];
        }
        code = marked->invalidated ? CAPTURE_INVALIDATED : SUCCESS;
    } else if (capture) {
        code = SUCCESS;
        if (flags & 1) {
            fake_node* node = captured_node(s, NODE_WAIT, &code);
            if (node) node->event = event;
        }
    }
    pthread_mutex_unlock(&graph_mutex);
    return code;
}

/* Stream-ordered allocations are not captured here: say so. */
static int capture_refuses(void* stream, const char* name) {
    if (__atomic_load_n(&active_captures, __ATOMIC_ACQUIRE) == 0) return NOT_CAPTURED;
    pthread_mutex_lock(&graph_mutex);
    int captured = capture_of(stream) != NULL;
    pthread_mutex_unlock(&graph_mutex);
    if (!captured) return NOT_CAPTURED;
    fprintf(stderr, "fake_cuda: unimplemented %s on a capturing stream\n", name);
    return NOT_SUPPORTED;
}

/* Whether the calling thread may make a call a capture does not allow now (on *stream*, if it
 * synchronizes or queries one); if not, the captures it conflicts with are invalidated and
 * CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED is the answer (see the top of this file). */
static int capture_forbids(void* stream) {
    if (__atomic_load_n(&active_captures, __ATOMIC_ACQUIRE) == 0) return SUCCESS;
    pthread_t self = pthread_self();
    int code = SUCCESS;
    pthread_mutex_lock(&graph_mutex);
    fake_capture* synchronized = stream ? capture_of(stream) : NULL;
    for (fake_capture* capture = captures; capture; capture = capture->next) {
        int own = pthread_equal(capture->thread, self);
        int conflict = capture == synchronized ||
                       (thread_mode != MODE_RELAXED && own && capture->mode != MODE_RELAXED) ||
                       (thread_mode == MODE_GLOBAL && !own && capture->mode == MODE_GLOBAL);
        if (conflict) {
            capture->invalidated = 1;
            code = CAPTURE_UNSUPPORTED;
        }
    }
    pthread_mutex_unlock(&graph_mutex);
    return code;
}

static void capture_forget_stream(void* stream) {
    if (__atomic_load_n(&active_captures, __ATOMIC_ACQUIRE) == 0) return;
    pthread_mutex_lock(&graph_mutex);
    if (capture_of(stream)) leave(stream);
    pthread_mutex_unlock(&graph_mutex);
}

int cuThreadExchangeStreamCaptureMode(int* mode) {
    if (*mode < MODE_GLOBAL || *mode > MODE_RELAXED) return INVALID_VALUE;
    int was = thread_mode;
    thread_mode = *mode;
    *mode = was;
    return SUCCESS;
}

/* Begin capturing *stream* into *graph* (NULL: a new one) after *deps*, in *mode*. */
static int begin_capture(void* stream, fake_graph* graph, fake_node* const* deps, size_t n_deps,
                         int mode) {
    if (is_special(stream)) return CAPTURE_UNSUPPORTED; /* the legacy stream cannot capture */
    if (mode < MODE_GLOBAL || mode > MODE_RELAXED || n_deps > MAX_TAIL) return INVALID_VALUE;
    fake_stream* s = stream;
    pthread_mutex_lock(&graph_mutex);
    if (s->capture) {
        pthread_mutex_unlock(&graph_mutex);
        return ILLEGAL_STATE;
    }
    fake_capture* capture = calloc(1, sizeof *capture);
    capture->id = next_capture_id++;
    capture->mode = mode;
    capture->thread = pthread_self();
    capture->own_graph = graph == NULL;
    capture->graph = graph ? graph : graph_new(0);
    capture->origin = s;
    join(capture, s);
    memcpy(s->tail, deps, n_deps * sizeof s->tail[0]);
    s->n_tail = n_deps;
    capture->next = captures;
    captures = capture;
    __atomic_add_fetch(&active_captures, 1, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&graph_mutex);
    return SUCCESS;
}

int cuStreamBeginCapture(void* stream, int mode) {
    need_stream_context(stream, "cuStreamBeginCapture");
    return begin_capture(stream, NULL, NULL, 0, mode);
}

int cuStreamBeginCaptureToGraph(void* stream, void* graph, void* const* deps, const void* edges,
                                size_t n_deps, int mode) {
    (void)edges;
    if (graph == NULL) return INVALID_VALUE;
    return begin_capture(stream, graph, (fake_node* const*)deps, n_deps, mode);
}

int cuStreamEndCapture(void* stream, void** graph_out) {
    *graph_out = NULL;
    pthread_mutex_lock(&graph_mutex);
    fake_capture* capture = capture_of(stream);
    int code = SUCCESS;
    if (capture == NULL) code = ILLEGAL_STATE;
    else if (capture->origin != stream) code = CAPTURE_UNMATCHED;
    else if (capture->mode != MODE_RELAXED && !pthread_equal(capture->thread, pthread_self()))
        code = CAPTURE_WRONG_THREAD;
    if (code != SUCCESS) {
        pthread_mutex_unlock(&graph_mutex);
        return code;
    }
    while (capture->n_members) leave(capture->members[capture->n_members - 1]);
    for (fake_capture** at = &captures; *at; at = &(*at)->next) {
        if (*at == capture) {
            *at = capture->next;
            break;
        }
    }
    __atomic_sub_fetch(&active_captures, 1, __ATOMIC_RELEASE);
    int discard = capture->invalidated && capture->own_graph && graph_unlink(capture->graph, 0);
    pthread_mutex_unlock(&graph_mutex);
    if (capture->invalidated) {
        code = CAPTURE_INVALIDATED;
        if (discard) graph_free(capture->graph);
    } else {
        *graph_out = capture->graph;
    }
    free(capture);
    return code;
}

int cuStreamIsCapturing(void* stream, int* status) {
    pthread_mutex_lock(&graph_mutex);
    fake_capture* capture = capture_of(stream);
    *status = capture == NULL ? STATUS_NONE
                              : (capture->invalidated ? STATUS_INVALIDATED : STATUS_ACTIVE);
    pthread_mutex_unlock(&graph_mutex);
    return SUCCESS;
}

/* The capture's status, id and graph, and the nodes the stream's next work depends on (valid
 * until the stream's next captured work). */
int cuStreamGetCaptureInfo(void* stream, int* status, unsigned long long* id, void** graph,
                           void* const** deps, const void** edges, size_t* n) {
    pthread_mutex_lock(&graph_mutex);
    fake_capture* capture = capture_of(stream);
    fake_stream* s = stream;
    *status = capture == NULL ? STATUS_NONE
                              : (capture->invalidated ? STATUS_INVALIDATED : STATUS_ACTIVE);
    if (id) *id = capture ? capture->id : 0;
    if (graph) *graph = capture ? capture->graph : NULL;
    if (deps) *deps = capture ? s->tail : NULL;
    if (edges) *edges = capture ? no_edge_data : NULL;
    if (n) *n = capture ? s->n_tail : 0;
    pthread_mutex_unlock(&graph_mutex);
    return SUCCESS;
}

/* Replace the nodes the stream's next work depends on (flags 0), or add to them (1). */
int cuStreamUpdateCaptureDependencies(void* stream, void* const* deps, const void* edges,
                                      size_t n, unsigned int flags) {
    (void)edges;
    pthread_mutex_lock(&graph_mutex);
    fake_capture* capture = capture_of(stream);
    fake_stream* s = stream;
    int code = capture == NULL ? ILLEGAL_STATE : SUCCESS;
    if (code == SUCCESS) {
        if (flags == 1 /* CU_STREAM_ADD_CAPTURE_DEPENDENCIES */) {
            for (size_t i = 0; i < n && s->n_tail < MAX_TAIL; i++) s->tail[s->n_tail++] = deps[i];
        } else {
            s->n_tail = n < MAX_TAIL ? n : MAX_TAIL;
            memcpy(s->tail, deps, s->n_tail * sizeof s->tail[0]);
        }
    }
    pthread_mutex_unlock(&graph_mutex);
    return code;
}

/* -- building graphs -------------------------------------------------------------------------- */

/* CUDA_KERNEL_NODE_PARAMS (_v2 and _v3 alike). */
typedef struct {
    void* func;
    unsigned int gx, gy, gz, bx, by, bz, shared;
    void** kernelParams;
    void** extra;
    void* kern; /* used when func is NULL */
    void* ctx;
} fake_kernel_params;

/* CUDA_MEMSET_NODE_PARAMS (_v2 has ctx too). */
typedef struct {
    uintptr_t dst;
    size_t pitch;
    unsigned int value, elementSize;
    size_t width, height;
    void* ctx;
} fake_memset_params;

/* CUDA_MEMCPY3D. */
typedef struct {
    size_t srcXInBytes, srcY, srcZ, srcLOD;
    int srcMemoryType; /* CUmemorytype: 1 host, 2 device, 3 array, 4 unified */
    const void* srcHost;
    uintptr_t srcDevice;
    void* srcArray;
    void* reserved0;
    size_t srcPitch, srcHeight;
    size_t dstXInBytes, dstY, dstZ, dstLOD;
    int dstMemoryType;
    void* dstHost;
    uintptr_t dstDevice;
    void* dstArray;
    void* reserved1;
    size_t dstPitch, dstHeight;
    size_t WidthInBytes, Height, Depth;
} fake_memcpy3d;

/* CUgraphNodeParams. */
typedef struct {
    int type;
    int reserved0[3];
    union {
        long long reserved1[29];
        fake_kernel_params kernel;
        struct {
            int flags, reserved;
            void* copyCtx;
            fake_memcpy3d copyParams;
        } memcpy;
        fake_memset_params memset;
        struct {
            void* event;
        } event;
    };
    long long reserved2;
} fake_node_params;

static void set_kernel(fake_node* node, const fake_kernel_params* params) {
    node->func = params->func ? params->func : params->kern;
    unsigned int dims[7] = {params->gx, params->gy, params->gz, params->bx,
                            params->by, params->bz, params->shared};
    memcpy(node->dims, dims, sizeof dims);
    keep_params(node, params->kernelParams);
}

static void get_kernel(const fake_node* node, fake_kernel_params* params) {
    memset(params, 0, sizeof *params);
    params->func = node->func;
    params->kern = node->func;
    params->gx = node->dims[0];
    params->gy = node->dims[1];
    params->gz = node->dims[2];
    params->bx = node->dims[3];
    params->by = node->dims[4];
    params->bz = node->dims[5];
    params->shared = node->dims[6];
    params->kernelParams = node->params;
}

/* A memcpy node's copy from CUDA_MEMCPY3D *copy*: 1D only. */
static int set_memcpy(fake_node* node, const fake_memcpy3d* copy) {
    if (copy->Height > 1 || copy->Depth > 1) {
        fprintf(stderr, "fake_cuda: unimplemented 2D/3D memcpy node\n");
        return NOT_SUPPORTED;
    }
    uintptr_t src = copy->srcMemoryType == 1 ? (uintptr_t)copy->srcHost : copy->srcDevice;
    uintptr_t dst = copy->dstMemoryType == 1 ? (uintptr_t)copy->dstHost : copy->dstDevice;
    node->src = src + copy->srcXInBytes;
    node->dst = dst + copy->dstXInBytes;
    node->bytes = copy->WidthInBytes;
    return SUCCESS;
}

static void get_memcpy(const fake_node* node, fake_memcpy3d* copy) {
    memset(copy, 0, sizeof *copy);
    copy->srcMemoryType = copy->dstMemoryType = 4; /* unified: every address is one */
    copy->srcDevice = node->src;
    copy->dstDevice = node->dst;
    copy->WidthInBytes = copy->srcPitch = copy->dstPitch = node->bytes;
    copy->Height = copy->Depth = 1;
}

static int set_memset(fake_node* node, const fake_memset_params* params) {
    if (params->elementSize != 1 && params->elementSize != 2 && params->elementSize != 4)
        return INVALID_VALUE;
    node->dst = params->dst;
    node->value = params->value;
    node->element = params->elementSize;
    node->width = params->width;
    node->height = params->height ? params->height : 1;
    node->pitch = node->height > 1 ? params->pitch : params->width * params->elementSize;
    return SUCCESS;
}

static void get_memset(const fake_node* node, fake_memset_params* params, int with_ctx) {
    params->dst = node->dst;
    params->pitch = node->pitch;
    params->value = node->value;
    params->elementSize = node->element;
    params->width = node->width;
    params->height = node->height;
    if (with_ctx) params->ctx = &contexts[0];
}

/* A new node of *type* in *graph*, or NULL (INVALID_VALUE) for a bad graph or dependency. */
static fake_node* add_node(void** node_out, void* graph, void* const* deps, size_t n_deps,
                           int type) {
    if (graph == NULL) return NULL;
    fake_graph* g = graph;
    for (size_t i = 0; i < n_deps; i++)
        if (deps[i] == NULL || ((fake_node*)deps[i])->graph != g) return NULL;
    fake_node* node = node_add(g, type, (fake_node* const*)deps, n_deps);
    *node_out = node;
    return node;
}

int cuGraphCreate(void** graph, unsigned int flags) {
    (void)flags;
    pthread_mutex_lock(&graph_mutex);
    *graph = graph_new(0);
    pthread_mutex_unlock(&graph_mutex);
    return SUCCESS;
}

int cuGraphDestroy(void* graph) {
    pthread_mutex_lock(&graph_mutex);
    int live = graph_unlink(graph, 0);
    pthread_mutex_unlock(&graph_mutex);
    if (!live) {
        __atomic_add_fetch(&refused_destroys, 1, __ATOMIC_SEQ_CST);
        return INVALID_VALUE;
    }
    graph_free(graph);
    return SUCCESS;
}

int cuGraphAddKernelNode(void** node, void* graph, void* const* deps, size_t n,
                         const fake_kernel_params* params) {
    pthread_mutex_lock(&graph_mutex);
    fake_node* made = add_node(node, graph, deps, n, NODE_KERNEL);
    if (made) set_kernel(made, params);
    pthread_mutex_unlock(&graph_mutex);
    return made ? SUCCESS : INVALID_VALUE;
}

int cuGraphAddMemcpyNode(void** node, void* graph, void* const* deps, size_t n,
                         const fake_memcpy3d* copy, void* ctx) {
    (void)ctx;
    pthread_mutex_lock(&graph_mutex);
    fake_node* made = add_node(node, graph, deps, n, NODE_MEMCPY);
    int code = made ? set_memcpy(made, copy) : INVALID_VALUE;
    pthread_mutex_unlock(&graph_mutex);
    return code;
}

int cuGraphAddMemsetNode(void** node, void* graph, void* const* deps, size_t n,
                         const fake_memset_params* params, void* ctx) {
    (void)ctx;
    pthread_mutex_lock(&graph_mutex);
    fake_node* made = add_node(node, graph, deps, n, NODE_MEMSET);
    int code = made ? set_memset(made, params) : INVALID_VALUE;
    pthread_mutex_unlock(&graph_mutex);
    return code;
}

int cuGraphAddEmptyNode(void** node, void* graph, void* const* deps, size_t n) {
    pthread_mutex_lock(&graph_mutex);
    fake_node* made = add_node(node, graph, deps, n, NODE_EMPTY);
    pthread_mutex_unlock(&graph_mutex);
    return made ? SUCCESS : INVALID_VALUE;
}

static int add_event_node(void** node, void* graph, void* const* deps, size_t n, void* event,
                          int type) {
    pthread_mutex_lock(&graph_mutex);
    fake_node* made = add_node(node, graph, deps, n, type);
    if (made) made->event = event;
    pthread_mutex_unlock(&graph_mutex);
    return made ? SUCCESS : INVALID_VALUE;
}

int cuGraphAddEventRecordNode(void** node, void* graph, void* const* deps, size_t n, void* event) {
    return add_event_node(node, graph, deps, n, event, NODE_RECORD);
}

int cuGraphAddEventWaitNode(void** node, void* graph, void* const* deps, size_t n, void* event) {
    return add_event_node(node, graph, deps, n, event, NODE_WAIT);
}

/* Set *node* (of params->type) from CUgraphNodeParams. */
static int set_node(fake_node* node, const fake_node_params* params) {
    switch (params->type) {
    case NODE_KERNEL: set_kernel(node, &params->kernel); return SUCCESS;
    case NODE_MEMCPY: return set_memcpy(node, &params->memcpy.copyParams);
    case NODE_MEMSET: return set_memset(node, &params->memset);
    case NODE_RECORD: case NODE_WAIT: node->event = params->event.event; return SUCCESS;
    case NODE_EMPTY: return SUCCESS;
    default:
        fprintf(stderr, "fake_cuda: unimplemented graph node type %d\n", params->type);
        return NOT_SUPPORTED;
    }
}

int cuGraphAddNode(void** node, void* graph, void* const* deps, const void* edges, size_t n,
                   fake_node_params* params) {
    (void)edges;
    pthread_mutex_lock(&graph_mutex);
    fake_node* made = add_node(node, graph, deps, n, params->type);
    int code = made ? set_node(made, params) : INVALID_VALUE;
    if (made && code != SUCCESS) { /* take it back: it was the last one added */
        made->graph->n--;
        node_free(made);
        *node = NULL;
    }
    pthread_mutex_unlock(&graph_mutex);
    return code;
}

/* -- user objects ---------------------------------------------------------------------------- */

int cuUserObjectCreate(void** object_out, void* ptr, void (*destroy)(void*), unsigned int refs,
                       unsigned int flags) {
    if (destroy == NULL || refs == 0 || flags != 1 /* CU_USER_OBJECT_NO_DESTRUCTOR_SYNC */)
        return INVALID_VALUE;
    fake_user_object* object = malloc(sizeof *object);
    object->ptr = ptr;
    object->destroy = destroy;
    object->refs = refs;
    *object_out = object;
    return SUCCESS;
}

int cuUserObjectRetain(void* object, unsigned int count) {
    if (object == NULL || count == 0) return INVALID_VALUE;
    __atomic_add_fetch(&((fake_user_object*)object)->refs, count, __ATOMIC_ACQ_REL);
    return SUCCESS;
}

int cuUserObjectRelease(void* object, unsigned int count) {
    if (object == NULL || count == 0) return INVALID_VALUE;
    user_object_release(object, count);
    return SUCCESS;
}

/* *graph* takes *count* references to *object*: new ones, or the caller's with
 * CU_GRAPH_USER_OBJECT_MOVE (1). */
int cuGraphRetainUserObject(void* graph, void* object, unsigned int count, unsigned int flags) {
    if (graph == NULL || object == NULL || count == 0) return INVALID_VALUE;
    fake_user_object* held = object;
    if (!(flags & 1)) __atomic_add_fetch(&held->refs, count, __ATOMIC_ACQ_REL);
    pthread_mutex_lock(&graph_mutex);
    graph_hold(graph, object, count);
    pthread_mutex_unlock(&graph_mutex);
    return SUCCESS;
}

int cuGraphReleaseUserObject(void* graph, void* object, unsigned int count) {
    if (graph == NULL || object == NULL || count == 0) return INVALID_VALUE;
    fake_graph* g = graph;
    int code = INVALID_VALUE;
    pthread_mutex_lock(&graph_mutex);
    for (size_t i = 0; i < g->n_held; i++) {
        if (g->held[i] == object && g->held_refs[i] >= count) {
            g->held_refs[i] -= count;
            if (g->held_refs[i] == 0) {
                g->held[i] = g->held[--g->n_held];
                g->held_refs[i] = g->held_refs[g->n_held];
            }
            code = SUCCESS;
            break;
        }
    }
    pthread_mutex_unlock(&graph_mutex);
    if (code == SUCCESS) user_object_release(object, count);
    return code;
}

/* -- inspecting graphs ------------------------------------------------------------------------ */

/* Answer a "list of nodes" query: *count* nodes of *from* (those *keep* accepts, if given)
 * into *out* (NULL: count them only), NULL-filled past the end; *n* is how many there are (or
 * were written, if *out* was too short). */
static void list_nodes(fake_node* const* from, size_t count, int (*keep)(const fake_node*),
                       void** out, size_t* n) {
    size_t found = 0;
    for (size_t i = 0; i < count; i++) {
        if (keep && !keep(from[i])) continue;
        if (out && found < *n) out[found] = from[i];
        found++;
    }
    if (out) {
        for (size_t i = found; i < *n; i++) out[i] = NULL;
        if (found > *n) found = *n;
    }
    *n = found;
}

static int is_root(const fake_node* node) { return node->n_deps == 0; }

int cuGraphGetNodes(void* graph, void** nodes, size_t* n) {
    if (graph == NULL || n == NULL) return INVALID_VALUE;
    pthread_mutex_lock(&graph_mutex);
    fake_graph* g = graph;
    list_nodes(g->nodes, g->n, NULL, nodes, n);
    pthread_mutex_unlock(&graph_mutex);
    return SUCCESS;
}

int cuGraphGetRootNodes(void* graph, void** nodes, size_t* n) {
    if (graph == NULL || n == NULL) return INVALID_VALUE;
    pthread_mutex_lock(&graph_mutex);
    fake_graph* g = graph;
    list_nodes(g->nodes, g->n, is_root, nodes, n);
    pthread_mutex_unlock(&graph_mutex);
    return SUCCESS;
}

/* The graph's edges: (from[i], to[i]), edge data all default. */
int cuGraphGetEdges(void* graph, void** from, void** to, unsigned char* edges, size_t* n) {
    if (graph == NULL || n == NULL) return INVALID_VALUE;
    pthread_mutex_lock(&graph_mutex);
    fake_graph* g = graph;
    size_t found = 0;
    for (size_t i = 0; i < g->n; i++) {
        for (size_t j = 0; j < g->nodes[i]->n_deps; j++) {
            if (from && found < *n) {
                from[found] = g->nodes[i]->deps[j];
                to[found] = g->nodes[i];
                if (edges) memset(edges + 8 * found, 0, 8);
            }
            found++;
        }
    }
    if (from && found > *n) found = *n;
    *n = found;
    pthread_mutex_unlock(&graph_mutex);
    return SUCCESS;
}

int cuGraphNodeGetDependencies(void* node, void** deps, unsigned char* edges, size_t* n) {
    if (node == NULL || n == NULL) return INVALID_VALUE;
    pthread_mutex_lock(&graph_mutex);
    fake_node* of = node;
    size_t room = *n;
    list_nodes(of->deps, of->n_deps, NULL, deps, n);
    if (edges && deps) memset(edges, 0, 8 * room);
    pthread_mutex_unlock(&graph_mutex);
    return SUCCESS;
}

int cuGraphNodeGetDependentNodes(void* node, void** dependents, unsigned char* edges, size_t* n) {
    if (node == NULL || n == NULL) return INVALID_VALUE;
    pthread_mutex_lock(&graph_mutex);
    fake_node* of = node;
    fake_graph* g = of->graph;
    size_t found = 0;
    for (size_t i = 0; i < g->n; i++) {
        for (size_t j = 0; j < g->nodes[i]->n_deps; j++) {
            if (g->nodes[i]->deps[j] != of) continue;
            if (dependents && found < *n) {
                dependents[found] = g->nodes[i];
                if (edges) memset(edges + 8 * found, 0, 8);
            }
            found++;
            break;
        }
    }
    if (dependents) {
        for (size_t i = found; i < *n; i++) dependents[i] = NULL;
        if (found > *n) found = *n;
    }
    *n = found;
    pthread_mutex_unlock(&graph_mutex);
    return SUCCESS;
}

int cuGraphNodeGetType(void* node, int* type) {
    if (node == NULL) return INVALID_VALUE;
    *type = ((fake_node*)node)->type;
    return SUCCESS;
}

int cuGraphNodeGetContainingGraph(void* node, void** graph) {
    if (node == NULL) return INVALID_VALUE;
    *graph = ((fake_node*)node)->graph;
    return SUCCESS;
}

int cuGraphGetId(void* graph, unsigned int* id) {
    if (graph == NULL) return INVALID_VALUE;
    *id = (unsigned int)((fake_graph*)graph)->id;
    return SUCCESS;
}

/* The kernel node's parameters: kernelParams point into the node (valid while it lives). */
int cuGraphKernelNodeGetParams(void* node, fake_kernel_params* params) {
    fake_node* of = node;
    if (of == NULL || of->type != NODE_KERNEL) return INVALID_VALUE;
    pthread_mutex_lock(&graph_mutex);
    get_kernel(of, params);
    pthread_mutex_unlock(&graph_mutex);
    return SUCCESS;
}

int cuGraphKernelNodeSetParams(void* node, const fake_kernel_params* params) {
    fake_node* of = node;
    if (of == NULL || of->type != NODE_KERNEL) return INVALID_VALUE;
    pthread_mutex_lock(&graph_mutex);
    set_kernel(of, params);
    pthread_mutex_unlock(&graph_mutex);
    return SUCCESS;
}

int cuGraphMemcpyNodeGetParams(void* node, fake_memcpy3d* copy) {
    fake_node* of = node;
    if (of == NULL || of->type != NODE_MEMCPY) return INVALID_VALUE;
    get_memcpy(of, copy);
    return SUCCESS;
}

int cuGraphMemsetNodeGetParams(void* node, fake_memset_params* params) {
    fake_node* of = node;
    if (of == NULL || of->type != NODE_MEMSET) return INVALID_VALUE;
    get_memset(of, params, 0); /* CUDA_MEMSET_NODE_PARAMS (v1): no ctx */
    return SUCCESS;
}

int cuGraphNodeGetParams(void* node, fake_node_params* params) {
    fake_node* of = node;
    if (of == NULL) return INVALID_VALUE;
    pthread_mutex_lock(&graph_mutex);
    memset(params, 0, sizeof *params);
    params->type = of->type;
    switch (of->type) {
    case NODE_KERNEL: get_kernel(of, &params->kernel); break;
    case NODE_MEMCPY:
        params->memcpy.copyCtx = &contexts[0];
        get_memcpy(of, &params->memcpy.copyParams);
        break;
    case NODE_MEMSET: get_memset(of, &params->memset, 1); break;
    case NODE_RECORD: case NODE_WAIT: params->event.event = of->event; break;
    default: break;
    }
    pthread_mutex_unlock(&graph_mutex);
    return SUCCESS;
}

int cuGraphNodeSetParams(void* node, const fake_node_params* params) {
    fake_node* of = node;
    if (of == NULL || params->type != of->type) return INVALID_VALUE;
    pthread_mutex_lock(&graph_mutex);
    int code = set_node(of, params);
    pthread_mutex_unlock(&graph_mutex);
    return code;
}

/* -- executable graphs ------------------------------------------------------------------------ */

/* An executable graph: a copy of the graph's nodes (see the top of this file). */
static fake_graph* instantiate(const fake_graph* graph) {
    fake_graph* exec = graph_new(1);
    for (size_t i = 0; i < graph->n; i++) node_copy(exec, graph->nodes[i]);
    for (size_t i = 0; i < graph->n_held; i++) {
        __atomic_add_fetch(&graph->held[i]->refs, graph->held_refs[i], __ATOMIC_ACQ_REL);
        graph_hold(exec, graph->held[i], graph->held_refs[i]);
    }
    return exec;
}

int cuGraphInstantiateWithFlags(void** exec, void* graph, unsigned long long flags) {
    need_context("cuGraphInstantiate");
    (void)flags;
    if (graph == NULL) return INVALID_VALUE;
    pthread_mutex_lock(&graph_mutex);
    *exec = instantiate(graph);
    pthread_mutex_unlock(&graph_mutex);
    return SUCCESS;
}

/* CUDA_GRAPH_INSTANTIATE_PARAMS. */
typedef struct {
    unsigned long long flags;
    void* hUploadStream;
    void* hErrNode_out;
    int result_out; /* CUgraphInstantiateResult: 0, CUDA_GRAPH_INSTANTIATE_SUCCESS */
} fake_instantiate_params;

int cuGraphInstantiateWithParams(void** exec, void* graph, fake_instantiate_params* params) {
    need_context("cuGraphInstantiate");
    int code = cuGraphInstantiateWithFlags(exec, graph, params ? params->flags : 0);
    if (params) {
        params->hErrNode_out = NULL;
        params->result_out = code == SUCCESS ? 0 : 1; /* 1: CUDA_GRAPH_INSTANTIATE_ERROR */
    }
    return code;
}

int cuGraphExecDestroy(void* exec) {
    pthread_mutex_lock(&graph_mutex);
    int live = graph_unlink(exec, 1);
    pthread_mutex_unlock(&graph_mutex);
    if (!live) return INVALID_VALUE;
    graph_free(exec);
    return SUCCESS;
}

int cuGraphExecGetFlags(void* exec, unsigned long long* flags) {
    if (exec == NULL) return INVALID_VALUE;
    *flags = 0;
    return SUCCESS;
}

int cuGraphExecGetId(void* exec, unsigned int* id) { return cuGraphGetId(exec, id); }

/* Every node is uploaded: it is all host memory. */
int cuGraphUpload(void* exec, void* stream) {
    need_stream_context(stream, "cuGraphUpload");
    (void)stream;
    return exec ? SUCCESS : INVALID_VALUE;
}

/* Run the executable graph's nodes now, in order (see the top of this file). */
int cuGraphLaunch(void* exec, void* stream) {
    need_stream_context(stream, "cuGraphLaunch");
    POISONED();
    if (exec == NULL) return INVALID_VALUE;
    if (__atomic_load_n(&active_captures, __ATOMIC_ACQUIRE) != 0) {
        pthread_mutex_lock(&graph_mutex);
        int captured = capture_of(stream) != NULL;
        pthread_mutex_unlock(&graph_mutex);
        if (captured) {
            fprintf(stderr, "fake_cuda: unimplemented cuGraphLaunch on a capturing stream\n");
            return NOT_SUPPORTED;
        }
    }
    if (queued_stream(stream)) { /* the deferred mode: the stream's earlier work runs first */
        pthread_mutex_lock(&queue_mutex);
        drive(stream, NULL, 0, DRIVE_TIME, 0);
        pthread_mutex_unlock(&queue_mutex);
    }
    host_cost(&graph_launch_cost_ns);
    pthread_mutex_lock(&graph_mutex);
    fake_graph* g = exec;
    for (size_t i = 0; i < g->n; i++) run_node(g->nodes[i], stream);
    pthread_mutex_unlock(&graph_mutex);
    return SUCCESS;
}

/* The executable graph's copy of the graph's *node*, or NULL. */
static fake_node* exec_node(fake_graph* exec, const void* node) {
    if (exec == NULL || node == NULL) return NULL;
    for (size_t i = 0; i < exec->n; i++)
        if (exec->nodes[i]->origin == node || exec->nodes[i]->updated_from == node)
            return exec->nodes[i];
    return NULL;
}

int cuGraphExecKernelNodeSetParams(void* exec, void* node, const fake_kernel_params* params) {
    pthread_mutex_lock(&graph_mutex);
    fake_node* copy = exec_node(exec, node);
    int code = copy && copy->type == NODE_KERNEL ? SUCCESS : INVALID_VALUE;
    if (code == SUCCESS) set_kernel(copy, params);
    pthread_mutex_unlock(&graph_mutex);
    return code;
}

int cuGraphExecMemcpyNodeSetParams(void* exec, void* node, const fake_memcpy3d* copy,
                                   void* ctx) {
    (void)ctx;
    pthread_mutex_lock(&graph_mutex);
    fake_node* of = exec_node(exec, node);
    int code = of && of->type == NODE_MEMCPY ? set_memcpy(of, copy) : INVALID_VALUE;
    pthread_mutex_unlock(&graph_mutex);
    return code;
}

int cuGraphExecMemsetNodeSetParams(void* exec, void* node, const fake_memset_params* params,
                                   void* ctx) {
    (void)ctx;
    pthread_mutex_lock(&graph_mutex);
    fake_node* of = exec_node(exec, node);
    int code = of && of->type == NODE_MEMSET ? set_memset(of, params) : INVALID_VALUE;
    pthread_mutex_unlock(&graph_mutex);
    return code;
}

int cuGraphExecNodeSetParams(void* exec, void* node, const fake_node_params* params) {
    pthread_mutex_lock(&graph_mutex);
    fake_node* of = exec_node(exec, node);
    int code = of && of->type == params->type ? set_node(of, params) : INVALID_VALUE;
    pthread_mutex_unlock(&graph_mutex);
    return code;
}

/* CUgraphExecUpdateResultInfo. */
typedef struct {
    int result; /* CUgraphExecUpdateResult: 0 success, 1 error, 2 topology changed, 3 type */
    void* errorNode;
    void* errorFromNode;
} fake_update_info;

/* Give the executable graph the parameters of *graph*'s nodes, if it has the same nodes (in
 * number, order, type and dependencies); its nodes then answer to *graph*'s too. */
int cuGraphExecUpdate(void* exec, void* graph, fake_update_info* info) {
    if (exec == NULL || graph == NULL) return INVALID_VALUE;
    pthread_mutex_lock(&graph_mutex);
    fake_graph* e = exec;
    fake_graph* g = graph;
    int result = e->n == g->n ? 0 : 2;
    void* at = NULL;
    for (size_t i = 0; result == 0 && i < g->n; i++) {
        if (e->nodes[i]->type != g->nodes[i]->type) result = 3;
        else if (i > 0 && g->nodes[i]->n_deps == 0 && g->nodes[i - 1]->n_deps != 0) result = 2;
        if (result) at = g->nodes[i];
    }
    for (size_t i = 0; result == 0 && i < g->n; i++) {
        node_assign(e->nodes[i], g->nodes[i]);
        e->nodes[i]->updated_from = g->nodes[i];
    }
    pthread_mutex_unlock(&graph_mutex);
    if (info) {
        info->result = result;
        info->errorNode = at;
        info->errorFromNode = NULL;
    }
    return result == 0 ? SUCCESS : GRAPH_EXEC_UPDATE_FAILURE;
}
