package main

// chart.png: ops/s per library for the contended 4×8 and 8×1 runs, as grouped bars, drawn
// with the standard image packages and basicfont.

import (
	"bytes"
	"fmt"
	"image"
	"image/color"
	"image/draw"
	"image/png"
	"math"
	"slices"

	"golang.org/x/image/font"
	"golang.org/x/image/font/basicfont"
	"golang.org/x/image/math/fixed"
)

var (
	colBG     = color.RGBA{255, 255, 255, 255}
	colText   = color.RGBA{30, 30, 30, 255}
	colGrid   = color.RGBA{225, 225, 225, 255}
	colAxis   = color.RGBA{90, 90, 90, 255}
	colSeries = []color.RGBA{{52, 101, 164, 255}, {237, 125, 49, 255}}
)

type series struct {
	scenario, label string
}

var chartSeries = []series{{"contended-4x8", "contended 4x8 (4 procs x 8 goroutines)"},
	{"contended-8x1", "contended 8x1 (8 procs x 1 goroutine)"}}

func (rp *report) chart() ([]byte, error) {
	var libs []string
	for _, l := range libNames {
		for _, s := range chartSeries {
			if rp.find(s.scenario, l) != nil && !slices.Contains(libs, l) {
				libs = append(libs, l)
			}
		}
	}
	const (
		left, right, top, bottom = 80, 30, 90, 50
		groupW, barW, barGap     = 150, 52, 8
		plotH                    = 420
	)
	w := max(960, left+right+max(1, len(libs))*groupW)
	h := top + plotH + bottom
	img := image.NewRGBA(image.Rect(0, 0, w, h))
	draw.Draw(img, img.Bounds(), image.NewUniform(colBG), image.Point{}, draw.Src)

	text(img, left, 28, "dlock benchmark: lock acquisitions per second (higher is better)", colText, 2)
	// Legend.
	lx := left
	for i, s := range chartSeries {
		fill(img, lx, 48, lx+14, 62, colSeries[i])
		text(img, lx+20, 60, s.label, colText, 1)
		lx += 20 + 7*len(s.label) + 30
	}
	text(img, 8, top-8, "ops/s", colText, 1)

	var vmax float64
	for _, l := range libs {
		for _, s := range chartSeries {
			if r := rp.find(s.scenario, l); r != nil {
				vmax = math.Max(vmax, r.OpsPerSec)
			}
		}
	}
	if len(libs) == 0 || vmax == 0 {
		text(img, left, top+plotH/2, "no contended 4x8 / 8x1 results in this run", colText, 1)
		return encodePNG(img)
	}
	step := niceStep(vmax / 5)
	ymax := math.Ceil(vmax/step) * step
	y := func(v float64) int { return top + plotH - int(math.Round(v/ymax*plotH)) }
	for v := 0.0; v <= ymax+step/2; v += step {
		yy := y(v)
		fill(img, left, yy, w-right, yy+1, colGrid)
		lbl := human(v)
		text(img, left-8-7*len(lbl), yy+4, lbl, colText, 1)
	}
	fill(img, left, top, left+1, top+plotH+1, colAxis)
	fill(img, left, top+plotH, w-right, top+plotH+1, colAxis)

	for gi, l := range libs {
		gx := left + gi*groupW
		inner := len(chartSeries)*barW + (len(chartSeries)-1)*barGap
		bx := gx + (groupW-inner)/2
		for si, s := range chartSeries {
			x0 := bx + si*(barW+barGap)
			r := rp.find(s.scenario, l)
			if r == nil {
				text(img, x0+barW/2-10, top+plotH-6, "n/a", colAxis, 1)
				continue
			}
			y0 := y(r.OpsPerSec)
			fill(img, x0, y0, x0+barW, top+plotH, colSeries[si])
			v := human(r.OpsPerSec)
			text(img, x0+barW/2-7*len(v)/2, y0-4, v, colText, 1)
		}
		text(img, gx+groupW/2-7*len(l)/2, top+plotH+20, l, colText, 1)
	}
	text(img, left, h-10, "Redis "+rp.machine.RedisVersion+", "+fmt.Sprint(rp.machine.NProc)+" CPUs, "+
		rp.duration.String()+" per run; see BENCHMARKS.md for waits, fairness and Redis cost", colAxis, 1)
	return encodePNG(img)
}

func encodePNG(img image.Image) ([]byte, error) {
	var b bytes.Buffer
	if err := png.Encode(&b, img); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

func fill(img *image.RGBA, x0, y0, x1, y1 int, c color.Color) {
	draw.Draw(img, image.Rect(x0, y0, x1, y1), image.NewUniform(c), image.Point{}, draw.Src)
}

// text draws s with its baseline at y, magnified scale times (nearest neighbour).
func text(dst *image.RGBA, x, y int, s string, c color.Color, scale int) {
	face := basicfont.Face7x13
	if scale <= 1 {
		d := font.Drawer{Dst: dst, Src: image.NewUniform(c), Face: face, Dot: fixed.P(x, y)}
		d.DrawString(s)
		return
	}
	wpx := font.MeasureString(face, s).Ceil()
	tmp := image.NewRGBA(image.Rect(0, 0, wpx, 13))
	d := font.Drawer{Dst: tmp, Src: image.NewUniform(c), Face: face, Dot: fixed.P(0, 11)}
	d.DrawString(s)
	for ty := 0; ty < 13; ty++ {
		for tx := 0; tx < wpx; tx++ {
			px := tmp.RGBAAt(tx, ty)
			if px.A == 0 {
				continue
			}
			for dy := 0; dy < scale; dy++ {
				for dx := 0; dx < scale; dx++ {
					X, Y := x+tx*scale+dx, y-11*scale+ty*scale+dy
					if image.Pt(X, Y).In(dst.Bounds()) {
						dst.SetRGBA(X, Y, blend(dst.RGBAAt(X, Y), px))
					}
				}
			}
		}
	}
}

func blend(bg, fg color.RGBA) color.RGBA {
	a := uint32(fg.A)
	mix := func(b, f uint8) uint8 { return uint8((uint32(f)*255 + uint32(b)*(255-a)) / 255) }
	// fg is premultiplied: f already carries a.
	return color.RGBA{mix(bg.R, fg.R), mix(bg.G, fg.G), mix(bg.B, fg.B), 255}
}

// niceStep rounds a raw tick step up to 1, 2, 2.5 or 5 × 10^k.
func niceStep(raw float64) float64 {
	if raw <= 0 {
		return 1
	}
	e := math.Pow(10, math.Floor(math.Log10(raw)))
	for _, m := range []float64{1, 2, 2.5, 5, 10} {
		if raw <= m*e {
			return m * e
		}
	}
	return 10 * e
}

// human formats a count compactly: 950, 12.3k, 1.2M.
func human(v float64) string {
	switch {
	case v >= 1e6:
		return fmt.Sprintf("%.1fM", v/1e6)
	case v >= 1e4:
		return fmt.Sprintf("%.0fk", v/1e3)
	case v >= 1e3:
		return fmt.Sprintf("%.1fk", v/1e3)
	}
	return fmt.Sprintf("%.0f", v)
}
