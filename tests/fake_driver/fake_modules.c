/* The stand-in's modules and kernels (included by fake_cuda.c).
 *
 * A library "loads" any code (the cubin NVRTC made) and keeps a copy, to answer NOT_FOUND for a
 * kernel name the code does not hold, as the driver does. Its kernels are handles of their own
 * that know their name, and a launch of one of these runs it on the host, at once, reading its
 * parameters from the kernelParams array (pointers are host addresses here):
 *   empty(int n)                                         nothing
 *   scale(const float* x, float* out, float a, int n)    out[i] = a * x[i]
 *   inc(float* buf, float step, int n)                   buf[i] += step
 *   fill(float* out, float value, long long n)           out[i] = value
 *   spin(long long cycles, int* done)                    done[0] = 1, no waiting (in the
 *                                                        deferred mode: cycles / 2 ns long)
 *   copy4(const uint4* x, uint4* out, long long n)       out[i] = x[i], 16 bytes each
 *   saxpy(const float* x, const float* y, float* out, float a, int n)   out = a * x + y
 * Anything else is counted and does nothing. At most one thread per element: i < n and i < the
 * launch's threads.
 */

typedef struct {
    unsigned char* image; /* a copy of the code, to look kernel names up in */
    size_t size;
} fake_library;

typedef struct {
    char name[128];
    fake_library* library; /* NULL once unloaded (the record stays, for fake_launch_count) */
    unsigned long long launches;
} fake_kernel;

static pthread_mutex_t kernel_mutex = PTHREAD_MUTEX_INITIALIZER;
static fake_kernel* kernels[4096];
static int n_kernels;
static long live_libraries;

/* How many bytes of *code* to keep: an ELF image (a cubin) to the end of its section headers,
 * else text (PTX) to its NUL; 0 for anything else (a fatbin: every name is then accepted). */
static size_t image_size(const unsigned char* code) {
    if (code == NULL) return 0;
    if (memcmp(code, "\177ELF", 4) == 0 && code[4] == 2) { /* 64-bit ELF */
        uint64_t shoff;
        uint16_t shentsize, shnum;
        memcpy(&shoff, code + 0x28, 8);
        memcpy(&shentsize, code + 0x3a, 2);
        memcpy(&shnum, code + 0x3c, 2);
        uint64_t size = shoff + (uint64_t)shentsize * shnum;
        return size < (1ULL << 30) ? (size_t)size : 0;
    }
    for (size_t i = 0; i < 64; i++) /* PTX starts with printable text */
        if (code[i] == 0 || code[i] > 0x7e || (code[i] < 0x20 && code[i] != '\n' && code[i] != '\t' && code[i] != '\r'))
            return 0;
    return strlen((const char*)code) + 1;
}

/* Whether *library* defines a kernel called *name*: the name is in the image as a word of its
 * own (a cubin's string table: between NULs; PTX: ".entry name("), or the image is unknown. */
static int defines(const fake_library* library, const char* name) {
    if (library->image == NULL) return 1;
    size_t n = strlen(name);
    const unsigned char* image = library->image;
    for (size_t i = 0; i + n < library->size; i++) {
        if (memcmp(image + i, name, n) != 0) continue;
        unsigned char before = i ? image[i - 1] : 0, after = image[i + n];
        if ((before == 0 || before == ' ' || before == '\t') &&
            (after == 0 || after == '(' || after == ' ' || after == '\n'))
            return 1;
    }
    return 0;
}

int cuLibraryLoadData(void** library, const void* code, void* jit_options, void* jit_values,
                      unsigned int n_jit, void* options, void* values, unsigned int n_options) {
    (void)jit_options; (void)jit_values; (void)n_jit;
    (void)options; (void)values; (void)n_options;
    POISONED();
    if (code == NULL) return INVALID_VALUE;
    fake_library* made = calloc(1, sizeof *made);
    made->size = image_size(code);
    if (made->size) {
        made->image = malloc(made->size);
        memcpy(made->image, code, made->size);
    }
    *library = made;
    __atomic_add_fetch(&live_libraries, 1, __ATOMIC_SEQ_CST);
    return SUCCESS;
}

int cuModuleLoadData(void** module, const void* image) {
    need_context("cuModuleLoadData"); /* a library (cuLibraryLoadData) needs none */
    return cuLibraryLoadData(module, image, NULL, NULL, 0, NULL, NULL, 0);
}

int cuLibraryUnload(void* handle) {
    fake_library* library = handle;
    pthread_mutex_lock(&kernel_mutex);
    for (int i = 0; i < n_kernels; i++)
        if (kernels[i]->library == library) kernels[i]->library = NULL;
    pthread_mutex_unlock(&kernel_mutex);
    free(library->image);
    free(library);
    __atomic_sub_fetch(&live_libraries, 1, __ATOMIC_SEQ_CST);
    return SUCCESS;
}

int cuModuleUnload(void* module) { return cuLibraryUnload(module); }

long fake_live_libraries(void) { return live_libraries; }

/* Each library's kernel of one name is one handle (as the driver's), made at the first ask. */
int cuLibraryGetKernel(void** kernel, void* library, const char* name) {
    if (!defines(library, name)) return NOT_FOUND;
    pthread_mutex_lock(&kernel_mutex);
    for (int i = 0; i < n_kernels; i++) {
        if (kernels[i]->library == library && strcmp(kernels[i]->name, name) == 0) {
            *kernel = kernels[i];
            pthread_mutex_unlock(&kernel_mutex);
            return SUCCESS;
        }
    }
    if (n_kernels == 4096) {
        pthread_mutex_unlock(&kernel_mutex);
        return OUT_OF_MEMORY;
    }
    fake_kernel* made = calloc(1, sizeof *made);
    snprintf(made->name, sizeof made->name, "%s", name);
    made->library = library;
    kernels[n_kernels++] = made;
    *kernel = made;
    pthread_mutex_unlock(&kernel_mutex);
    return SUCCESS;
}

int cuModuleGetFunction(void** function, void* module, const char* name) {
    return cuLibraryGetKernel(function, module, name);
}

int cuKernelGetFunction(void** function, void* kernel) {
    need_context("cuKernelGetFunction"); /* the kernel's function in the current context */
    POISONED();
    *function = kernel;
    return SUCCESS;
}
int cuLibraryGetModule(void** module, void* library) { *module = library; return SUCCESS; }

int cuKernelGetName(const char** name, void* kernel) {
    *name = ((fake_kernel*)kernel)->name;
    return SUCCESS;
}
int cuFuncGetName(const char** name, void* function) { return cuKernelGetName(name, function); }

int cuKernelGetAttribute(int* value, int attribute, void* kernel, int device) {
    (void)kernel; (void)device;
    *value = attribute == 0 ? 1024 : 0; /* max threads per block; sizes and the rest 0 */
    return SUCCESS;
}
int cuFuncGetAttribute(int* value, int attribute, void* function) {
    return cuKernelGetAttribute(value, attribute, function, 0);
}
int cuKernelSetAttribute(int attribute, int value, void* kernel, int device) {
    (void)attribute; (void)value; (void)kernel; (void)device;
    return SUCCESS;
}
int cuFuncSetAttribute(void* function, int attribute, int value) {
    (void)function; (void)attribute; (void)value;
    return SUCCESS;
}

/* How many launches of kernels called *name* there were. */
unsigned long long fake_launch_count(const char* name) {
    unsigned long long n = 0;
    pthread_mutex_lock(&kernel_mutex);
    for (int i = 0; i < n_kernels; i++)
        if (strcmp(kernels[i]->name, name) == 0) n += kernels[i]->launches;
    pthread_mutex_unlock(&kernel_mutex);
    return n;
}

/* The sizes of the parameters of *kernel* (at most 8), as emulate() reads them, in *sizes*; how
 * many it has, or -1 for a kernel the stand-in does not run (a graph's kernel node keeps its
 * parameter values by these sizes: fake_graphs.c). */
static int param_sizes(const fake_kernel* kernel, size_t* sizes) {
    static const struct {
        const char* name;
        int n;
        size_t sizes[8];
    } known[] = {
        {"empty", 1, {4}},        {"scale", 4, {8, 8, 4, 4}}, {"inc", 3, {8, 4, 4}},
        {"fill", 3, {8, 4, 8}},   {"spin", 2, {8, 8}},        {"copy4", 3, {8, 8, 8}},
        {"saxpy", 5, {8, 8, 8, 4, 4}}, {"partial", 3, {8, 8, 4}},
    };
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++) {
        if (strcmp(kernel->name, known[i].name) == 0) {
            memcpy(sizes, known[i].sizes, sizeof known[i].sizes);
            return known[i].n;
        }
    }
    return -1;
}

#define ARG(type, i) (*(type*)params[i])

static void emulate(fake_kernel* kernel, unsigned long long threads, void** params) {
    __atomic_add_fetch(&kernel->launches, 1, __ATOMIC_SEQ_CST);
    const char* name = kernel->name;
    if (strcmp(name, "scale") == 0) {
        const float* x = ARG(const float*, 0);
        float* out = ARG(float*, 1);
        float a = ARG(float, 2);
        long long n = ARG(int, 3);
        for (long long i = 0; i < n && (unsigned long long)i < threads; i++) out[i] = a * x[i];
    } else if (strcmp(name, "inc") == 0) {
        float* buf = ARG(float*, 0);
        float step = ARG(float, 1);
        long long n = ARG(int, 2);
        for (long long i = 0; i < n && (unsigned long long)i < threads; i++) buf[i] += step;
    } else if (strcmp(name, "fill") == 0) {
        float* out = ARG(float*, 0);
        float value = ARG(float, 1);
        long long n = ARG(long long, 2);
        for (long long i = 0; i < n && (unsigned long long)i < threads; i++) out[i] = value;
    } else if (strcmp(name, "copy4") == 0) {
        const unsigned char* x = ARG(const unsigned char*, 0);
        unsigned char* out = ARG(unsigned char*, 1);
        long long n = ARG(long long, 2);
        if ((unsigned long long)n > threads) n = (long long)threads;
        if (n > 0) memcpy(out, x, 16 * (size_t)n);
    } else if (strcmp(name, "saxpy") == 0) {
        const float* x = ARG(const float*, 0);
        const float* y = ARG(const float*, 1);
        float* out = ARG(float*, 2);
        float a = ARG(float, 3);
        long long n = ARG(int, 4);
        for (long long i = 0; i < n && (unsigned long long)i < threads; i++) out[i] = a * x[i] + y[i];
    } else if (strcmp(name, "partial") == 0) { /* tests/test_cuda_outputs.py */
        const float* x = ARG(const float*, 0);
        float* out = ARG(float*, 1);
        long long m = ARG(int, 2);
        for (long long i = 0; i < m && (unsigned long long)i < threads; i++) out[i] = x[i] + 1.0f;
    } else if (strcmp(name, "spin") == 0) {
        ARG(int*, 1)[0] = 1;
    }
}
