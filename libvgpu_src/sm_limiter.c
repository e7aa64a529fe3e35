/* SM share limiter (placeholder: no limit applied yet). */
#include "sm_limiter.h"
#include "internal.h"

void hami_sm_before_launch(int dev, CUstream stream)
{
    (void)dev;
    (void)stream;
}

void hami_sm_after_launch(int dev, CUstream stream, CUresult result)
{
    (void)dev;
    (void)stream;
    (void)result;
}
