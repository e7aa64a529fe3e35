"""The PTX of the simulator's `spin` test kernel, which reads its first parameter as its
duration in microseconds."""

PTX = b"""
.version 8.0
.target sm_90
.address_size 64

.visible .entry spin(.param .u64 spin_param_0)
{
    ret;
}
"""
