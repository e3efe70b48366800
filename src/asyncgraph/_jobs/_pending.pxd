# PendingDispatch as an extension type, for the compiled build of _pending.py (Cython's pure
# Python mode: that module is the one source; this file only declares its types). The compiled
# core cimports it and calls new_pending and set_outcome through C.
#
# The fields are the slots of PendingDispatch.__slots__, of the same names (keep the two alike);
# public, as the slots are attributes.

cdef int _PENDING, _DONE, _FAILED

cdef class PendingDispatch:
    cdef object __weakref__
    cdef public object _callbacks
    cdef public object _device_time
    cdef public object _event
    cdef public object _loop
    cdef public object _outcome
    cdef public object _spin
    cdef public int _state
    cdef public object _traceback
    cdef public object _waiters
    cdef public object _withdraw
    cdef public object dispatch_id
    cdef public object kernel_name


cpdef _start(PendingDispatch pending, object loop, object dispatch_id, object kernel_name, object spin)
cpdef PendingDispatch new_pending(object loop, object dispatch_id, object kernel_name, object spin=*)
cpdef set_outcome(PendingDispatch pending, object outcome, object device_time)
cpdef set_withdraw(PendingDispatch pending, object withdraw)
cpdef set_spin(PendingDispatch pending, object spin)
