/* Container ids: the rule of hami_runtime/ids.py (runc's own, and no ".."). */
#include "ids.h"

#include <string.h>

int valid_container_id(const char *id)
{
    size_t n = strlen(id);
    if (n == 0 || n > MAX_ID || strstr(id, ".."))
        return 0;
    for (size_t i = 0; i < n; i++) {
        char c = id[i];
        int alnum = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
        if (!alnum && (i == 0 || !strchr("_.+-", c)))
            return 0;
    }
    return 1;
}
