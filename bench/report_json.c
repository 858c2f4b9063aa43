/*
 * pp_report's latest.json (schema pinpool-bench/3): the run, the machine,
 * every group with its medians and ratios, W9's cases, the goals and the
 * failed runs.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "report_data.h"

static void json_str(FILE *f, const char *s) {
  fputc('"', f);
  for (; *s; s++) {
    unsigned char c = (unsigned char)*s;
    if (c == '"' || c == '\\')
      fprintf(f, "\\%c", c);
    else if (c < 0x20)
      fprintf(f, "\\u%04x", c);
    else
      fputc(c, f);
  }
  fputc('"', f);
}

/* Literal JSON text (keys, separators), then a value. */
static void json_put_str(FILE *f, const char *text, const char *s) {
  fputs(text, f);
  json_str(f, s);
}

static void json_put_num(FILE *f, const char *text, double v) {
  fputs(text, f);
  pr_json_num(f, v);
}

/* A --peer / --missing argument, NAME=TEXT: NAME into name, TEXT returned
 * ("" without '='). */
static const char *split_spec(const char *spec, char *name, size_t len) {
  const char *eq = strchr(spec, '=');
  size_t n = eq ? (size_t)(eq - spec) : strlen(spec);
  snprintf(name, len, "%.*s", (int)n, spec);
  return eq ? eq + 1 : "";
}

void pr_write_json(const pr_machine_t *m) {
  char date[64];
  FILE *f = pr_open_dated(pr_opt.json, "%Y-%m-%dT%H:%M:%SZ", date, sizeof date);
  json_put_str(f, "{\n  \"schema\": \"pinpool-bench/3\",\n  \"git_revision\": ",
               pr_opt.rev);
  fprintf(f, ",\n  \"date\": \"%s\",\n  \"mode\": ", date);
  json_str(f, pr_opt.mode);
  json_put_num(f, ",\n  \"elapsed_s\": ", pr_opt.elapsed);
  json_put_str(f, ",\n  \"machine\": {\"uname\": ", m->uname);
  fprintf(f, ", \"nproc\": %ld, \"cpu_model\": ", m->nproc);
  json_str(f, m->cpu);
  fprintf(f, ", \"mem_total_gib\": %.1f, \"thp\": ", m->mem_gib);
  json_str(f, m->thp);
  json_put_str(f, ", \"memlock_limit\": ", m->memlock);
  fprintf(f, ", \"uid\": %d, \"loadavg_start\": ", m->uid);
  json_str(f, pr_opt.load_start ? pr_opt.load_start : "");
  json_put_str(f,
               ", \"loadavg_end\": ", pr_opt.load_end ? pr_opt.load_end : "");
  fprintf(f, "},\n  \"peers\": [");
  for (int i = 0; i < pr_opt.npeers; i++) {
    char name[64];
    const char *value = split_spec(pr_opt.peers[i], name, sizeof name);
    fprintf(f, "%s\n    {\"name\": ", i ? "," : "");
    json_str(f, name);
    json_put_str(f, ", \"version\": ", value);
    fprintf(f, ", \"available\": true}");
  }
  for (int i = 0; i < pr_opt.nmissing; i++) {
    char name[64];
    const char *value = split_spec(pr_opt.missing[i], name, sizeof name);
    fprintf(f, "%s\n    {\"name\": ", pr_opt.npeers + i ? "," : "");
    json_str(f, name);
    json_put_str(f, ", \"available\": false, \"reason\": ", value);
    fprintf(f, "}");
  }
  fprintf(f, "\n  ],\n  \"results\": [");
  for (int i = 0; i < pr_ngroups; i++) {
    const pr_group_t *g = &pr_groups[i];
    if (g->nruns == 0)
      continue;
    fprintf(f, "%s\n    {\"workload\": ", i ? "," : "");
    json_str(f, g->workload);
    json_put_str(f, ", \"case\": ", g->kase);
    json_put_str(f, ", \"impl\": ", g->impl);
    json_put_str(f, ", \"mode\": ", g->mode);
    fprintf(f, ", \"threads\": %d, \"reps\": %d, \"config\": ", g->threads,
            g->nruns);
    json_str(f, g->config);
    json_put_num(f, ",\n     \"ns_per_op_median\": ", pr_get(g, "ns_med"));
    json_put_num(f, ", \"ns_per_op_p99\": ", pr_get(g, "ns_p99"));
    json_put_num(f, ", \"ops_per_s\": ", pr_get(g, "ops_per_s"));
    json_put_num(f, ", \"overhead\": ",
                 strcmp(g->workload, "W4") == 0
                     ? pr_get(g, "reserved_over_need")
                     : pr_get(g, "overhead"));
    json_put_num(f, ", \"backend_calls\": ", pr_get(g, "backend_calls"));
    json_put_num(f, ", \"minflt_per_op\": ", pr_get(g, "minflt_per_op"));
    json_put_num(f, ", \"ratio_ns_to_pinpool\": ", g->ratio_ns);
    json_put_num(f, ", \"ratio_ops_to_pinpool\": ", g->ratio_ops);
    json_put_num(f, ", \"ns_over_floor\": ", g->over_floor_ns);
    json_put_num(f, ", \"ratio_to_floor\": ", g->ratio_floor);
    fprintf(f, ",\n     \"metrics\": {");
    for (int k = 0; k < g->nagg; k++) {
      fprintf(f, "%s", k ? ", " : "");
      json_str(f, g->agg[k].key);
      json_put_num(f, ": ", g->agg[k].v);
    }
    fprintf(f, "}, \"notes\": [");
    for (int k = 0; k < g->nnotes; k++) {
      fprintf(f, "%s", k ? ", " : "");
      json_str(f, g->notes[k]);
    }
    fprintf(f, "]}");
  }
  fprintf(f, "\n  ],\n  \"unavailable\": [");
  if (!pr_have_workload("W8")) {
    json_put_str(f, "{\"workload\": \"W8\", \"reason\": ", PR_W8_REASON);
    fprintf(f, "}");
  }
  const char *w9_why = pr_w9_unavailable();
  if (w9_why != NULL) {
    /* after W8's entry, if W8 is unavailable too */
    fprintf(f, "%s{\"workload\": \"W9\", \"reason\": ",
            pr_have_workload("W8") ? "" : ", ");
    json_str(f, w9_why);
    fprintf(f, "}");
  }
  fprintf(f, "],\n  ");
  pr_w9_write_json(f);
  fprintf(f, ",\n  \"failures\": [");
  for (int i = 0; i < pr_nfail; i++) {
    fprintf(f, "%s", i ? ", " : "");
    json_str(f, pr_fail[i].text);
  }
  fprintf(f, "],\n  \"goals\": [");
  for (int i = 0; i < pr_ngoals; i++) {
    fprintf(f, "%s\n    {\"goal\": ", i ? "," : "");
    json_str(f, pr_goals[i].name);
    json_put_str(f, ", \"status\": ", pr_goals[i].status);
    json_put_str(f, ", \"detail\": ", pr_goals[i].detail);
    fprintf(f, "}");
  }
  fprintf(f, "\n  ]\n}\n");
  if (fclose(f) != 0)
    pr_die("cannot write %s", pr_opt.json);
}
