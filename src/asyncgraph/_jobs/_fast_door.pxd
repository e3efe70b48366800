# FastDoor as an extension type, for the compiled build of _fast_door.py (Cython's pure Python
# mode: that module is the one source; this file only declares its types). The compiled core
# cimports it and calls its transitions through C.
#
# The fields are the slots of FastDoor.__slots__, of the same names (keep the two alike).

cdef object _LAUNCHED, _DONE

cdef class FastDoor:
    cdef public dict in_flight
    cdef public dict queue
    cdef public list parked
    cdef public Py_ssize_t limit

    cpdef admit_launched(self, object job)
    cpdef withdraw(self, object job)
    cpdef bint complete_launched(self, object job, object outcome) except -1
