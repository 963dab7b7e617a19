package store

import (
	"context"
	"log/slog"
	"slices"
	"sort"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// slogCore sends etcd's zap logs to the injected slog logger, tagged
// component=etcd, so that the daemon has one log stream.
type slogCore struct {
	l      *slog.Logger
	min    zapcore.Level
	fields []zapcore.Field
}

func newEtcdLogger(l *slog.Logger, level string) *zap.Logger {
	min := zapcore.WarnLevel
	if lv, err := zapcore.ParseLevel(level); err == nil {
		min = lv
	}
	return zap.New(slogCore{l: l, min: min})
}

func (c slogCore) Enabled(l zapcore.Level) bool { return l >= c.min }

func (c slogCore) With(fs []zapcore.Field) zapcore.Core {
	c.fields = append(slices.Clone(c.fields), fs...)
	return c
}

func (c slogCore) Check(e zapcore.Entry, ce *zapcore.CheckedEntry) *zapcore.CheckedEntry {
	if c.Enabled(e.Level) {
		return ce.AddCore(e, c)
	}
	return ce
}

func (c slogCore) Write(e zapcore.Entry, fs []zapcore.Field) error {
	enc := zapcore.NewMapObjectEncoder()
	for _, f := range c.fields {
		f.AddTo(enc)
	}
	for _, f := range fs {
		f.AddTo(enc)
	}
	keys := make([]string, 0, len(enc.Fields))
	for k := range enc.Fields {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	attrs := []any{"component", "etcd"}
	for _, k := range keys {
		attrs = append(attrs, k, enc.Fields[k])
	}
	lvl := slog.LevelError
	switch {
	case e.Level <= zapcore.DebugLevel:
		lvl = slog.LevelDebug
	case e.Level == zapcore.InfoLevel:
		lvl = slog.LevelInfo
	case e.Level == zapcore.WarnLevel:
		lvl = slog.LevelWarn
	}
	c.l.Log(context.Background(), lvl, e.Message, attrs...)
	return nil
}

func (c slogCore) Sync() error { return nil }
