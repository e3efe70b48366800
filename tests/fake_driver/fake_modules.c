/* The stand-in's modules and kernels (included by fake_cuda.c).
 *
 * A library "loads" any code (the cubin NVRTC made); its kernels are known by name, and a
 * launch of one of these runs it on the host, at once, reading its parameters from the
 * kernelParams array (pointers are host addresses here):
 *   empty(int n)                                         nothing
 *   scale(const float* x, float* out, float a, int n)    out[i] = a * x[i]
 *   inc(float* buf, float step, int n)                   buf[i] += step
 *   fill(float* out, float value, long long n)           out[i] = value
 *   spin(long long cycles, int* done)                    done[0] = 1, no waiting
 *   copy4(const uint4* x, uint4* out, long long n)       out[i] = x[i], 16 bytes each
 *   saxpy(const float* x, const float* y, float* out, float a, int n)   out = a * x + y
 * Anything else is counted and does nothing. At most one thread per element: i < n and i < the
 * launch's threads.
 */

typedef struct {
    char name[128];
    unsigned long long launches;
} fake_kernel;

static pthread_mutex_t kernel_mutex = PTHREAD_MUTEX_INITIALIZER;
static fake_kernel* kernels[1024];
static int n_kernels;
static long live_libraries;

int cuLibraryLoadData(void** library, const void* code, void* jit_options, void* jit_values,
                      unsigned int n_jit, void* options, void* values, unsigned int n_options) {
    (void)code; (void)jit_options; (void)jit_values; (void)n_jit;
    (void)options; (void)values; (void)n_options;
    *library = calloc(1, 16);
    __atomic_add_fetch(&live_libraries, 1, __ATOMIC_SEQ_CST);
    return SUCCESS;
}

int cuLibraryUnload(void* library) {
    free(library);
    __atomic_sub_fetch(&live_libraries, 1, __ATOMIC_SEQ_CST);
    return SUCCESS;
}

long fake_live_libraries(void) { return live_libraries; }

int cuLibraryGetKernel(void** kernel, void* library, const char* name) {
    (void)library;
    pthread_mutex_lock(&kernel_mutex);
    for (int i = 0; i < n_kernels; i++) {
        if (strcmp(kernels[i]->name, name) == 0) {
            *kernel = kernels[i];
            pthread_mutex_unlock(&kernel_mutex);
            return SUCCESS;
        }
    }
    if (n_kernels == 1024) {
        pthread_mutex_unlock(&kernel_mutex);
        return OUT_OF_MEMORY;
    }
    fake_kernel* made = calloc(1, sizeof *made);
    snprintf(made->name, sizeof made->name, "%s", name);
    kernels[n_kernels++] = made;
    *kernel = made;
    pthread_mutex_unlock(&kernel_mutex);
    return SUCCESS;
}

int cuKernelGetFunction(void** function, void* kernel) { *function = kernel; return SUCCESS; }
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
    } else if (strcmp(name, "spin") == 0) {
        ARG(int*, 1)[0] = 1;
    }
}
