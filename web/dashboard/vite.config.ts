import { defineConfig } from 'vite';

// The production build is embedded in the Go binary (internal/dashboard/dist,
// go:embed). It must be deterministic: two builds give byte-identical files.
export default defineConfig({
  base: '/dashboard/',
  oxc: {
    jsx: { runtime: 'automatic', importSource: 'preact' },
  },
  build: {
    outDir: '../../internal/dashboard/dist',
    emptyOutDir: true,
    sourcemap: false,
    // Inline nothing as data: URLs; keep every asset a hashed file.
    assetsInlineLimit: 0,
    chunkSizeWarningLimit: 600,
  },
});
