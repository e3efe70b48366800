# ResidentBuffer and ResidentStore as extension types, for the compiled build of _resident.py
# (Cython's pure Python mode: that module is the one source; this file only declares its
# types). The compiled core cimports it and calls the store's is_live, track_uses, untrack and
# the readers through C.
#
# The fields are the slots of each class's __slots__, of the same names (keep the two alike);
# public, as the slots are attributes.

cdef class ResidentBuffer:
    cdef object __weakref__
    cdef public object _exports
    cdef public object _generation
    cdef public object _in_use  # an int (an object, as the slot holds)
    cdef public list _readers
    cdef public Py_ssize_t _slot
    cdef public object _storage
    cdef public ResidentStore _store
    cdef public object _writer
    cdef public object dtype
    cdef public object nbytes
    cdef public object shape


cdef class ResidentStore:
    cdef object __weakref__
    cdef public list _buffers
    cdef public list _free_slots
    cdef public object _free_storage
    cdef public list _generations
    cdef public object backend_name
    cdef public object bytes_live
    cdef public bint closed
    cdef public object exporter

    cpdef bint is_live(self, ResidentBuffer buffer) except -1


cpdef _record(ResidentBuffer buffer, object use, bint write)
cpdef list track(ResidentBuffer buffer, object use, bint write)
cpdef track_uses(list buffers, tuple writes, object use)
cpdef _forget(ResidentBuffer buffer, object use, object prior)
cpdef untrack(ResidentBuffer buffer, object use)
cpdef storage_of(ResidentBuffer buffer)
cpdef writer_of(ResidentBuffer buffer)
cpdef list readers_of(ResidentBuffer buffer)
