package main

// The picture: one small line chart per panel in a grid, drawn with the standard image
// packages and basicfont, as bench/chart.go draws docs/chart.png (no plotting library).

import (
	"image"
	"image/color"
	"image/draw"
	"math"
	"strconv"

	"golang.org/x/image/font"
	"golang.org/x/image/font/basicfont"
	"golang.org/x/image/math/fixed"
)

// A chart is one panel: its title and the series its queries returned.
type chart struct {
	title string
	step  float64 // the queries' step in seconds: points further apart have a gap between
	lines []line
}

// A line is one series of a panel.
type line struct {
	label   string
	unit    string    // what the y axis counts: "per second", "seconds", "count"
	seconds bool      // values are durations: ticks read 20ms, 1.5s
	right   bool      // plotted against the right-hand axis
	t, v    []float64 // seconds since the workload started; value (NaN: no value, a gap)
}

const (
	width, height = 1200, 800
	header        = 46 // the page title's band
	cols, rows    = 2, 3
)

var (
	colBG    = color.RGBA{255, 255, 255, 255}
	colText  = color.RGBA{30, 30, 30, 255}
	colMuted = color.RGBA{110, 110, 110, 255}
	colGrid  = color.RGBA{228, 228, 228, 255}
	colAxis  = color.RGBA{90, 90, 90, 255}
	colFrame = color.RGBA{200, 200, 200, 255}
	// Dark enough to read on white; consecutive colours far apart.
	palette = []color.RGBA{{31, 119, 180, 255}, {214, 39, 40, 255}, {44, 160, 44, 255}, {255, 127, 14, 255},
		{148, 103, 189, 255}, {140, 86, 75, 255}, {23, 190, 207, 255}, {227, 119, 194, 255}}
)

// drawDashboard draws charts in a grid under title and subtitle; span is the run's length in
// seconds, the extent of every time axis.
func drawDashboard(title, subtitle string, charts []chart, span float64) *image.RGBA {
	img := image.NewRGBA(image.Rect(0, 0, width, height))
	fill(img, img.Bounds(), colBG)
	bold(img, 12, 19, title, colText)
	text(img, 12, 36, subtitle, colMuted)
	cw, ch := width/cols, (height-header)/rows
	for i, c := range charts {
		if i >= cols*rows {
			break
		}
		x0, y0 := (i%cols)*cw, header+(i/cols)*ch
		drawChart(img, image.Rect(x0, y0, x0+cw, y0+ch).Inset(6), c, span)
	}
	return img
}

// An axis maps values to rows of the plot.
type axis struct {
	max, step float64
	seconds   bool
	unit      string
}

func newAxis(lines []line, right bool) *axis {
	a := &axis{}
	found := false
	for _, l := range lines {
		if l.right != right {
			continue
		}
		found, a.seconds, a.unit = true, l.seconds, l.unit
		for _, v := range l.v {
			if !math.IsNaN(v) && !math.IsInf(v, 0) {
				a.max = math.Max(a.max, v)
			}
		}
	}
	if !found {
		return nil
	}
	if a.max <= 0 {
		a.max = 1
	}
	// Some headroom above the highest point, then a round top with 4 or 5 ticks.
	a.step = niceStep(a.max * 1.05 / 4)
	a.max = math.Ceil(a.max*1.05/a.step) * a.step
	return a
}

func drawChart(img *image.RGBA, r image.Rectangle, c chart, span float64) {
	frame(img, r, colFrame)
	bold(img, r.Min.X+8, r.Min.Y+17, c.title, colText)

	left, right := newAxis(c.lines, false), newAxis(c.lines, true)
	legendRows := legendLayout(c.lines, r.Dx()-16)
	plot := image.Rect(r.Min.X+62, r.Min.Y+44, r.Max.X-16, r.Max.Y-24-14*legendRows)
	if right != nil {
		plot.Max.X = r.Max.X - 62
	}
	y := func(a *axis, v float64) int {
		return plot.Max.Y - int(math.Round(v/a.max*float64(plot.Dy())))
	}
	x := func(t float64) int { return plot.Min.X + int(math.Round(t/span*float64(plot.Dx()))) }

	// Tick labels of both axes; grid lines of the left one only, so they do not interleave.
	for _, a := range []*axis{left, right} {
		if a == nil {
			continue
		}
		isRight := a == right
		for v := 0.0; v <= a.max+a.step/2; v += a.step {
			yy := y(a, v)
			if !isRight {
				fill(img, image.Rect(plot.Min.X, yy, plot.Max.X, yy+1), colGrid)
			}
			lbl := tick(v, a)
			if isRight {
				text(img, plot.Max.X+6, yy+4, lbl, colMuted)
			} else {
				text(img, plot.Min.X-6-textW(lbl), yy+4, lbl, colMuted)
			}
		}
		if isRight {
			text(img, r.Max.X-8-textW(a.unit), plot.Min.Y-12, a.unit, colMuted)
		} else {
			text(img, r.Min.X+8, plot.Min.Y-12, a.unit, colMuted)
		}
	}
	// Time axis: a tick every 10s (20s, 40s for longer runs).
	tstep := 10.0
	for span/tstep > 8 {
		tstep *= 2
	}
	for t := 0.0; t <= span+1e-9; t += tstep {
		xx := x(t)
		fill(img, image.Rect(xx, plot.Min.Y, xx+1, plot.Max.Y), colGrid)
		lbl := strconv.Itoa(int(t)) + "s"
		text(img, xx-textW(lbl)/2, plot.Max.Y+15, lbl, colMuted)
	}
	fill(img, image.Rect(plot.Min.X, plot.Min.Y, plot.Min.X+1, plot.Max.Y+1), colAxis)
	fill(img, image.Rect(plot.Min.X, plot.Max.Y, plot.Max.X+1, plot.Max.Y+1), colAxis)
	if right != nil {
		fill(img, image.Rect(plot.Max.X, plot.Min.Y, plot.Max.X+1, plot.Max.Y+1), colAxis)
	}

	// The series: a polyline broken where a value is missing (NaN, or a skipped step).
	for i, l := range c.lines {
		a, col := left, palette[i%len(palette)]
		if l.right {
			a = right
		}
		prev, havePrev := image.Point{}, false
		for j := range l.t {
			v := l.v[j]
			if math.IsNaN(v) || math.IsInf(v, 0) {
				havePrev = false
				continue
			}
			p := image.Pt(x(l.t[j]), y(a, v))
			gap := j > 0 && l.t[j]-l.t[j-1] > 1.5*c.step
			if havePrev && !gap {
				segment(img, prev, p, col)
			} else {
				fill(img, image.Rect(p.X-1, p.Y-1, p.X+2, p.Y+2), col) // a lone point shows as a dot
			}
			prev, havePrev = p, true
		}
	}

	// Legend, under the time axis, wrapped to the chart's width.
	lx, ly := r.Min.X+8, plot.Max.Y+30
	for i, l := range c.lines {
		lbl := legendLabel(l)
		w := 16 + textW(lbl) + 16
		if lx+w > r.Max.X-8 && lx > r.Min.X+8 {
			lx, ly = r.Min.X+8, ly+14
		}
		fill(img, image.Rect(lx, ly-6, lx+12, ly-3), palette[i%len(palette)])
		text(img, lx+16, ly, lbl, colText)
		lx += w
	}
}

// legendLabel is a line's legend entry, with its last value as a Grafana legend table's
// "Last" column shows it: a p50 a hundred times under its p99 is flat on the chart, but not
// in the legend.
func legendLabel(l line) string {
	lbl := l.label
	if l.right {
		lbl += " (right axis)"
	}
	for i := len(l.v) - 1; i >= 0; i-- {
		if v := l.v[i]; !math.IsNaN(v) && !math.IsInf(v, 0) {
			return lbl + ": " + value(v, l)
		}
	}
	return lbl
}

// value formats v to two significant digits (a whole number as it is), in ms or s for durations, "/s" for rates.
func value(v float64, l line) string {
	unit := ""
	switch {
	case l.seconds && v >= 1:
		unit = "s"
	case l.seconds:
		v, unit = v*1e3, "ms"
	case l.unit == "per second":
		unit = "/s"
	}
	d := 0
	if v != math.Trunc(v) { // a count of leases is whole
		d = max(0, 1-int(math.Floor(math.Log10(math.Abs(v)))))
	}
	return strconv.FormatFloat(v, 'f', d, 64) + unit
}

// legendLayout returns how many rows the legend of lines takes in width w.
func legendLayout(lines []line, w int) int {
	rows, x := 1, 0
	for _, l := range lines {
		lw := 16 + textW(legendLabel(l)) + 16
		if x+lw > w && x > 0 {
			rows, x = rows+1, 0
		}
		x += lw
	}
	return rows
}

// tick formats an axis value: durations in the unit that suits the axis's top, counts and
// rates with as many decimals as the tick step needs.
func tick(v float64, a *axis) string {
	switch {
	case v == 0:
		return "0"
	case !a.seconds:
		return decimals(v, a.step)
	case a.max >= 1:
		return decimals(v, a.step) + "s"
	case a.max >= 1e-3:
		return decimals(v*1e3, a.step*1e3) + "ms"
	}
	return decimals(v*1e6, a.step*1e6) + "us"
}

func decimals(v, step float64) string {
	d := 0
	for ; d < 6; d++ {
		s := step * math.Pow(10, float64(d))
		if math.Abs(s-math.Round(s)) < 1e-6 {
			break
		}
	}
	return strconv.FormatFloat(v, 'f', d, 64)
}

// niceStep rounds a raw tick step up to 1, 2, 2.5 or 5 × 10^k.
func niceStep(raw float64) float64 {
	e := math.Pow(10, math.Floor(math.Log10(raw)))
	for _, m := range []float64{1, 2, 2.5, 5} {
		if raw <= m*e*(1+1e-9) {
			return m * e
		}
	}
	return 10 * e
}

// segment draws a 2-pixel-wide line from p to q (Bresenham).
func segment(img *image.RGBA, p, q image.Point, c color.RGBA) {
	dx, dy := abs(q.X-p.X), -abs(q.Y-p.Y)
	sx, sy := sign(q.X-p.X), sign(q.Y-p.Y)
	e := dx + dy
	for {
		fill(img, image.Rect(p.X, p.Y, p.X+2, p.Y+2), c)
		if p == q {
			return
		}
		if e2 := 2 * e; e2 >= dy {
			e += dy
			p.X += sx
		} else {
			e += dx
			p.Y += sy
		}
	}
}

func abs(n int) int { return max(n, -n) }

func sign(n int) int {
	switch {
	case n > 0:
		return 1
	case n < 0:
		return -1
	}
	return 0
}

func fill(img *image.RGBA, r image.Rectangle, c color.Color) {
	draw.Draw(img, r, image.NewUniform(c), image.Point{}, draw.Src)
}

func frame(img *image.RGBA, r image.Rectangle, c color.Color) {
	fill(img, image.Rect(r.Min.X, r.Min.Y, r.Max.X, r.Min.Y+1), c)
	fill(img, image.Rect(r.Min.X, r.Max.Y-1, r.Max.X, r.Max.Y), c)
	fill(img, image.Rect(r.Min.X, r.Min.Y, r.Min.X+1, r.Max.Y), c)
	fill(img, image.Rect(r.Max.X-1, r.Min.Y, r.Max.X, r.Max.Y), c)
}

// textW is how wide text draws s: basicfont.Face7x13 advances 7 pixels a character.
func textW(s string) int { return 7 * len(s) }

// text draws s with its baseline at y.
func text(img *image.RGBA, x, y int, s string, c color.Color) {
	d := font.Drawer{Dst: img, Src: image.NewUniform(c), Face: basicfont.Face7x13, Dot: fixed.P(x, y)}
	d.DrawString(s)
}

// bold draws s twice, a pixel apart: basicfont has no bold face.
func bold(img *image.RGBA, x, y int, s string, c color.Color) {
	text(img, x, y, s, c)
	text(img, x+1, y, s, c)
}
