/*
 * The pickle of `pinpool snapshot torch` (snapshot_torch_pickle.c): the
 * snapshot as torch.cuda.memory._snapshot() returns it, segments, blocks
 * and trace, written with pickle.c. Names start with tv_.
 */
#ifndef PINPOOL_TOOLS_SNAPSHOT_TORCH_PICKLE_H
#define PINPOOL_TOOLS_SNAPSHOT_TORCH_PICKLE_H

#include <stdio.h>

#include "snapshot_load.h"
#include "snapshot_torch_layout.h"
#include "snapshot_torch_trace.h"

/* Write the pickle of s (the segments of lay, the events of ev that are
 * kept) to f: the torch 1.x list of segments if old, else the torch 2.x
 * dict. 0, or -1 on ENOMEM or a write error. */
int tv_write_pickle(const snap_t *s, const tv_layout_t *lay,
                    const tv_events_t *ev, int old, FILE *f);

#endif /* PINPOOL_TOOLS_SNAPSHOT_TORCH_PICKLE_H */
