/* Container ids, checked as hami_runtime/ids.py checks them. */
#ifndef HAMI_LAUNCHER_IDS_H
#define HAMI_LAUNCHER_IDS_H

#define MAX_ID 1024

/* 1 for [A-Za-z0-9][A-Za-z0-9_.+-]{0,1023} without "..", else 0. */
int valid_container_id(const char *id);

#endif
