import { useEffect, useRef } from 'preact/hooks';
import uPlot from 'uplot';
import 'uplot/dist/uPlot.min.css';

export type SeriesSpec = { label: string; stroke: string; fill?: string; bars?: boolean; dash?: number[] };

type Props = {
  testid: string;
  title?: string;
  series: SeriesSpec[];
  // [xs (unix seconds), ...ys]
  data: (number | null)[][];
  fmt: (v: number) => string;
  height?: number;
  yMin?: number;
  yMax?: number;
  // the smallest top of the y scale (so an idle chart does not show 0..1 B)
  yFloor?: number;
  empty?: string;
  // ticks at powers of two (for bytes)
  binary?: boolean;
};

const POW2 = Array.from({ length: 60 }, (_, i) => 2 ** i);

// A uPlot chart made once per mount; later data goes through setData, and the
// chart follows its wrapper's width.
export function Chart({ testid, title, series, data, fmt, height = 160, yMin, yMax, yFloor = 1, empty = 'No samples yet.', binary = false }: Props) {
  const host = useRef<HTMLDivElement>(null);
  const plot = useRef<uPlot | null>(null);
  const fmtRef = useRef(fmt);
  fmtRef.current = fmt;

  useEffect(() => {
    const el = host.current!;
    const width = Math.max(200, el.clientWidth || 400);
    const bars = uPlot.paths.bars ? uPlot.paths.bars({ size: [0.7, 40] }) : undefined;
    const opts: uPlot.Options = {
      width,
      height,
      legend: { show: true, live: true },
      cursor: { drag: { x: false, y: false } },
      scales: {
        x: { time: true },
        y: {
          range: (_u, min, max) => {
            const lo = yMin ?? Math.min(0, min ?? 0);
            let hi = Math.max(max ?? 0, lo + yFloor);
            if (yMax !== undefined) hi = Math.max(hi, yMax);
            return [lo, hi * (yMax !== undefined && hi === yMax ? 1 : 1.1)];
          },
        },
      },
      axes: [
        { stroke: '#555', grid: { stroke: '#eee' }, ticks: { stroke: '#ddd' } },
        {
          stroke: '#555',
          grid: { stroke: '#eee' },
          ticks: { stroke: '#ddd' },
          size: 74,
          incrs: binary ? POW2 : undefined,
          values: (_u, vals) => vals.map((v) => fmtRef.current(v)),
        },
      ],
      series: [
        { label: 'time', value: (_u, v) => (v == null ? '—' : new Date(v * 1000).toLocaleTimeString()) },
        ...series.map((s) => ({
          label: s.label,
          stroke: s.stroke,
          fill: s.fill,
          width: 1.5,
          dash: s.dash,
          paths: s.bars ? bars : undefined,
          points: { show: false },
          value: (_u: uPlot, v: number | null) => (v == null ? '—' : fmtRef.current(v)),
        })),
      ],
    };
    const u = new uPlot(opts, data as uPlot.AlignedData, el);
    plot.current = u;
    const ro = new ResizeObserver(() => {
      const w = el.clientWidth;
      if (w > 0 && Math.abs(w - u.width) > 1) u.setSize({ width: w, height });
    });
    ro.observe(el);
    return () => {
      ro.disconnect();
      u.destroy();
      plot.current = null;
    };
    // Made once; data changes go through setData below.
    // eslint-disable-next-line react-hooks/exhaustive-deps
  }, []);

  useEffect(() => {
    plot.current?.setData(data as uPlot.AlignedData);
  }, [data]);

  const none = !data[0] || data[0].length === 0;
  return (
    <div class="chart" data-testid={testid}>
      {title && <div class="chart-title">{title}</div>}
      <div class="chart-body">
        <div ref={host} class="chart-host" />
        {none && <div class="chart-empty">{empty}</div>}
      </div>
    </div>
  );
}
