#!/usr/bin/env node
// Checks the chart's Grafana dashboard against Grafana's published schema: its JSON, assigned to
// `SavedDashboard` (schema.ts, from @grafana/schema), must type-check with no error, and its grid
// must be one Grafana keeps as written (unique ids, no overlap, 24 columns). Then the same check
// runs on broken copies of the dashboard, each of which must fail: proof that it can.
//
// Usage: node scripts/dashboard-schema/check.mjs [DASHBOARD.json]   (exit 1 on any failure)
import { readFileSync } from 'node:fs';
import { dirname, join, relative, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

import ts from 'typescript';

const here = dirname(fileURLToPath(import.meta.url));
const dashboardPath = resolve(process.argv[2] ?? join(here, '../../charts/shardwise/dashboards/shardwise.json'));
const shown = relative(process.cwd(), dashboardPath);

/** The TypeScript module that types a dashboard: its JSON starts on the second line. */
const PRELUDE = "import type { SavedDashboard } from './schema';\nexport const dashboard: SavedDashboard = ";

/**
 * Type-checks each named JSON text as a `SavedDashboard`, in one program (the schema is read
 * once). Returns, per name, the errors as "line:column: message" in that JSON text.
 */
function typeErrors(texts) {
  const config = ts.getParsedCommandLineOfConfigFile(join(here, 'tsconfig.json'), {}, {
    ...ts.sys,
    onUnRecoverableConfigFileDiagnostic: (d) => {
      throw new Error(ts.flattenDiagnosticMessageText(d.messageText, '\n'));
    },
  });
  const files = new Map([...texts].map(([name, text], i) => [join(here, `dashboard-${i}.ts`), { name, text }]));
  const host = ts.createCompilerHost(config.options);
  const { getSourceFile, fileExists, readFile } = host;
  host.fileExists = (path) => files.has(path) || fileExists.call(host, path);
  host.readFile = (path) => (files.has(path) ? PRELUDE + files.get(path).text : readFile.call(host, path));
  host.getSourceFile = (path, language, ...rest) =>
    files.has(path)
      ? ts.createSourceFile(path, PRELUDE + files.get(path).text, language)
      : getSourceFile.call(host, path, language, ...rest);
  const program = ts.createProgram([...files.keys()], config.options, host);
  const errors = new Map([...texts.keys()].map((name) => [name, []]));
  for (const d of ts.getPreEmitDiagnostics(program)) {
    const message = ts.flattenDiagnosticMessageText(d.messageText, '\n  ');
    const file = d.file && files.get(d.file.fileName);
    if (!file) {
      // An error in the schema itself or its setup: no dashboard can be checked.
      throw new Error(`${d.file?.fileName ?? 'tsc'}: ${message}`);
    }
    const { line, character } = d.file.getLineAndCharacterOfPosition(d.start);
    // Line 1 of the JSON follows the prelude's declaration on the module's second line.
    const column = line === 1 ? character - PRELUDE.split('\n')[1].length : character;
    errors.get(file.name).push(`${line}:${column + 1}: ${message}`);
  }
  return errors;
}

/** Panels at every level (rows hold theirs when collapsed). */
function allPanels(dashboard) {
  return (dashboard.panels ?? []).flatMap((p) => [p, ...(p.panels ?? [])]);
}

/** What Grafana would change in the layout on load: duplicate ids, panels out of the grid or overlapping. */
function layoutErrors(dashboard) {
  const errors = [];
  const seen = new Set();
  const placed = [];
  for (const panel of allPanels(dashboard)) {
    const name = `panel ${panel.id} ${JSON.stringify(panel.title)}`;
    if (seen.has(panel.id)) errors.push(`${name}: id used twice`);
    seen.add(panel.id);
    const g = panel.gridPos;
    // A position that is not four integers is a type error, reported as such.
    if (![g?.x, g?.y, g?.w, g?.h].every(Number.isInteger)) continue;
    if (g.x < 0 || g.w < 1 || g.x + g.w > 24) errors.push(`${name}: columns ${g.x}..${g.x + g.w} outside 0..24`);
    for (const [other, o] of placed) {
      if (g.x < o.x + o.w && o.x < g.x + g.w && g.y < o.y + o.h && o.y < g.y + g.h) {
        errors.push(`${name} overlaps ${other}`);
      }
    }
    placed.push([name, g]);
  }
  return errors;
}

/** Broken copies of the dashboard, each with one mistake the check must catch. */
const MUTANTS = {
  'a grid position of the wrong type (w as a string)': (d) => {
    const panel = allPanels(d).find((p) => p.type !== 'row');
    panel.gridPos.w = String(panel.gridPos.w);
  },
  'a stat option outside its enum (colorMode "rainbow")': (d) => {
    allPanels(d).find((p) => p.type === 'stat').options.colorMode = 'rainbow';
  },
  'a time series legend without the calcs Grafana saves': (d) => {
    delete allPanels(d).find((p) => p.type === 'timeseries').options.legend.calcs;
  },
  'a bar gauge option of the wrong type (showUnfilled "yes")': (d) => {
    allPanels(d).find((p) => p.type === 'bargauge').options.showUnfilled = 'yes';
  },
  'a misspelt field config key (unti)': (d) => {
    const defaults = allPanels(d).find((p) => p.type === 'timeseries').fieldConfig.defaults;
    defaults.unti = defaults.unit;
    delete defaults.unit;
  },
  'no schemaVersion': (d) => {
    delete d.schemaVersion;
  },
  'two panels in the same place': (d) => {
    const [first, second] = allPanels(d).filter((p) => p.type !== 'row');
    second.gridPos = { ...first.gridPos };
  },
};

function main() {
  const text = readFileSync(dashboardPath, 'utf8');
  const dashboard = JSON.parse(text);
  const texts = new Map([[shown, text]]);
  const failures = [];
  for (const [name, mutate] of Object.entries(MUTANTS)) {
    const copy = structuredClone(dashboard);
    try {
      mutate(copy);
      texts.set(name, JSON.stringify(copy, null, 2));
    } catch (e) {
      // The dashboard lacks what the mistake needs (say, no bar gauge): the check is not proven.
      failures.push(`cannot make a broken copy with ${name}: ${e.message}`);
    }
  }
  const errors = typeErrors(texts);
  const found = [...errors.get(shown).map((e) => `${shown}:${e}`), ...layoutErrors(dashboard).map((e) => `${shown}: ${e}`)];
  if (found.length) failures.push(...found);
  for (const name of [...texts.keys()].slice(1)) {
    const caught = errors.get(name).length + layoutErrors(JSON.parse(texts.get(name))).length;
    if (caught === 0) failures.push(`the check misses a broken dashboard: ${name}`);
  }
  if (failures.length) {
    console.error(failures.join('\n'));
    return 1;
  }
  console.log(
    `${shown}: ${allPanels(dashboard).length} panels match @grafana/schema ` +
      `${JSON.parse(readFileSync(join(here, 'node_modules/@grafana/schema/package.json'), 'utf8')).version}; ` +
      `${Object.keys(MUTANTS).length} broken copies rejected`,
  );
  return 0;
}

process.exitCode = main();
