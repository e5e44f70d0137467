// The shardwise dashboard as Grafana saves it, in the types Grafana publishes (@grafana/schema):
// the dashboard model, with the fields Grafana fills on load made required, and each panel's
// options and field config typed by its plugin's own schema. check.mjs assigns the dashboard's
// JSON to `SavedDashboard`.
import type {
  AnnotationQuery,
  Dashboard,
  DataQuery,
  DataSourceRef,
  FieldConfig,
  FieldConfigSource,
  GraphFieldConfig,
  Panel,
  RowPanel,
  VariableModel,
} from '@grafana/schema';
import type * as barGauge from '@grafana/schema/dist/esm/raw/composable/bargauge/panelcfg/x/BarGaugePanelCfg_types.gen';
import type * as stat from '@grafana/schema/dist/esm/raw/composable/stat/panelcfg/x/StatPanelCfg_types.gen';
import type * as timeSeries from '@grafana/schema/dist/esm/raw/composable/timeseries/panelcfg/x/TimeSeriesPanelCfg_types.gen';

/** `T` with the keys `K` required. */
type With<T, K extends keyof T> = T & Required<Pick<T, K>>;

/**
 * A JSON value that fits `T`: Grafana's enums are TypeScript enums, which no literal from JSON
 * can be, so each string enum becomes the union of its values.
 */
export type Json<T> = T extends string
  ? `${T}`
  : T extends (infer U)[]
    ? Json<U>[]
    : T extends object
      ? { [K in keyof T]: Json<T[K]> }
      : T;

/**
 * A Prometheus query as Grafana's Prometheus data source saves it. Its model ships with the
 * data source plugin, not with @grafana/schema, so this follows the plugin's saved JSON.
 */
export interface PrometheusQuery extends DataQuery {
  datasource: DataSourceRef;
  editorMode: 'code' | 'builder';
  expr: string;
  instant: boolean;
  legendFormat: string;
  range: boolean;
}

/** What Grafana writes into every field config it saves. */
type SavedFieldConfig<Custom> = With<Omit<FieldConfig, 'custom'>, 'color' | 'mappings' | 'thresholds' | 'unit'> & {
  custom?: Custom;
};

/** A panel with queries, as Grafana saves it, for the plugin `Type` of version `Version`. */
interface QueryPanel<Type extends string, Version extends string, Options, Custom = never>
  extends With<
    Omit<Panel, 'type' | 'options' | 'fieldConfig' | 'targets' | 'pluginVersion'>,
    'datasource' | 'description' | 'gridPos' | 'id' | 'title'
  > {
  type: Type;
  pluginVersion: Version;
  options: Options;
  fieldConfig: Omit<FieldConfigSource, 'defaults'> & { defaults: SavedFieldConfig<Custom> };
  targets: PrometheusQuery[];
}

/** The series options Grafana's time series panel saves (the rest stay optional). */
type SavedGraphFieldConfig = With<
  GraphFieldConfig,
  | 'axisBorderShow'
  | 'axisCenteredZero'
  | 'axisColorMode'
  | 'axisLabel'
  | 'axisPlacement'
  | 'barAlignment'
  | 'barWidthFactor'
  | 'drawStyle'
  | 'fillOpacity'
  | 'gradientMode'
  | 'hideFrom'
  | 'insertNulls'
  | 'lineInterpolation'
  | 'lineWidth'
  | 'pointSize'
  | 'scaleDistribution'
  | 'showPoints'
  | 'spanNulls'
  | 'stacking'
  | 'thresholdsStyle'
>;

export type StatPanel = QueryPanel<'stat', typeof stat.pluginVersion, stat.Options>;
export type BarGaugePanel = QueryPanel<'bargauge', typeof barGauge.pluginVersion, barGauge.Options>;
export type TimeSeriesPanel = QueryPanel<
  'timeseries',
  typeof timeSeries.pluginVersion,
  timeSeries.Options & { legend: With<timeSeries.TimeSeriesLegendOptions, 'displayMode'> },
  SavedGraphFieldConfig
>;
export type Row = With<Omit<RowPanel, 'panels'>, 'gridPos' | 'title'> & {
  type: 'row';
  panels: (StatPanel | BarGaugePanel | TimeSeriesPanel)[];
};

/** A template variable as saved; `current` stays optional: Grafana picks it on load. */
type SavedVariable = With<
  VariableModel,
  'hide' | 'includeAll' | 'label' | 'multi' | 'options' | 'query' | 'refresh' | 'regex' | 'skipUrlSync'
>;

export type SavedDashboard = Json<
  With<
    Omit<Dashboard, 'panels' | 'templating' | 'annotations'>,
    | 'description'
    | 'editable'
    | 'fiscalYearStartMonth'
    | 'graphTooltip'
    | 'id'
    | 'links'
    | 'liveNow'
    | 'refresh'
    | 'tags'
    | 'time'
    | 'timepicker'
    | 'timezone'
    | 'title'
    | 'uid'
    | 'version'
    | 'weekStart'
  > & {
    annotations: { list: With<AnnotationQuery, 'builtIn' | 'hide' | 'type'>[] };
    templating: { list: SavedVariable[] };
    panels: (Row | StatPanel | BarGaugePanel | TimeSeriesPanel)[];
  }
>;
