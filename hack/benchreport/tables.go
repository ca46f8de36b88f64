package main

import (
	"fmt"
	"slices"
	"strings"
)

// summary is the table of every floor pair: benchmark, what, value,
// floor, ratio.
func (rd *renderer) summary() string {
	rows := [][]string{}
	for _, p := range rd.pairs {
		if b := rd.run.benches[p.bench]; b != nil && b.skipped != "" {
			rows = append(rows, []string{code(p.bench), p.what, "skipped in this run", "", ""})
			continue
		}
		prs, err := rd.pairRows(p)
		if err != nil {
			continue // checkPairs reports it
		}
		for _, r := range prs {
			rows = append(rows, []string{code(strings.TrimSuffix(r.bench+"/"+r.sub, "/")), r.what,
				r.value.text + " " + r.value.unit, r.floor.text + " " + r.floor.unit, r.ratio()})
		}
	}
	return table([]string{"benchmark", "what", "value", "floor", "ratio"}, rows)
}

// bench is the section of benchmark name: its table, its floors, and
// what it printed.
func (rd *renderer) bench(name string) string {
	if !strings.HasPrefix(name, "Benchmark") {
		rd.errs = append(rd.errs, fmt.Errorf("the template's bench %q names no benchmark: use trials for a test", name))
		return ""
	}
	b := rd.run.benches[name]
	if !rd.place(name, b != nil) {
		return ""
	}
	var parts []string
	if b.skipped != "" {
		parts = append(parts, fmt.Sprintf("*Skipped in this run:* %s\n", b.skipped))
	}
	if len(b.results) == 1 && b.results[0].sub == "" {
		parts = append(parts, rd.singleTable(b))
	} else if len(b.results) > 0 {
		parts = append(parts, subTable(b), rd.floorTable(b))
	}
	parts = append(parts, codeBlock(b.printed))
	return joinBlocks(parts)
}

// joinBlocks joins the non-empty markdown blocks with a blank line.
func joinBlocks(blocks []string) string {
	return strings.Join(slices.DeleteFunc(blocks, func(b string) bool { return b == "" }), "\n")
}

// singleTable is a benchmark without sub-benchmarks: a row per metric,
// with the floor and the ratio of those that have one.
func (rd *renderer) singleTable(b *benchmark) string {
	floors := map[string]pairRow{}
	for _, p := range rd.pairs {
		if p.bench != b.name {
			continue
		}
		prs, _ := rd.pairRows(p) // checkPairs reports the errors
		for _, r := range prs {
			floors[r.value.unit] = r
		}
	}
	header := []string{code(b.name), "value"}
	if len(floors) > 0 {
		header = append(header, "floor", "ratio")
	}
	var rows [][]string
	for _, m := range b.results[0].metrics {
		row := []string{m.unit, m.text}
		if len(floors) > 0 {
			row = append(row, "", "")
			if f, ok := floors[m.unit]; ok {
				row[2], row[3] = f.floor.text+" "+f.floor.unit, f.ratio()
			}
		}
		rows = append(rows, row)
	}
	return table(header, rows)
}

// subTable is a benchmark with sub-benchmarks: a row per sub-benchmark,
// a column per unit.
func subTable(b *benchmark) string {
	var units []string
	for _, r := range b.results {
		for _, m := range r.metrics {
			if !slices.Contains(units, m.unit) {
				units = append(units, m.unit)
			}
		}
	}
	var rows [][]string
	for _, r := range b.results {
		row := []string{code(r.sub)}
		if r.sub == "" {
			row[0] = "(itself)"
		}
		for _, u := range units {
			m, _ := r.metric(u)
			row = append(row, m.text)
		}
		rows = append(rows, row)
	}
	return table(append([]string{code(b.name)}, units...), rows)
}

// floorTable is the floor pairs of a benchmark with sub-benchmarks.
func (rd *renderer) floorTable(b *benchmark) string {
	var rows [][]string
	for _, p := range rd.pairs {
		if p.bench != b.name {
			continue
		}
		prs, _ := rd.pairRows(p) // checkPairs reports the errors
		for _, r := range prs {
			rows = append(rows, []string{code(r.sub), r.what, r.value.text + " " + r.value.unit, r.floor.text + " " + r.floor.unit, r.ratio()})
		}
	}
	if len(rows) == 0 {
		return ""
	}
	return table([]string{"against its floor", "what", "value", "floor", "ratio"}, rows)
}

// trials is the section of test name: the lines of its trials.
func (rd *renderer) trials(name string) string {
	if !strings.HasPrefix(name, "Test") {
		rd.errs = append(rd.errs, fmt.Errorf("the template's trials %q names no test: use bench for a benchmark", name))
		return ""
	}
	t := rd.run.tests[name]
	if !rd.place(name, t != nil) {
		return ""
	}
	if t.skipped != "" {
		return fmt.Sprintf("*Skipped in this run:* %s\n", t.skipped)
	}
	if len(t.lines) == 0 {
		return fmt.Sprintf("%s printed no trial line in this run.\n", code(name))
	}
	return codeBlock(t.lines)
}

// table is a markdown table.
func table(header []string, rows [][]string) string {
	var out strings.Builder
	line := func(cells []string) {
		for _, c := range cells {
			out.WriteString("| " + strings.ReplaceAll(c, "|", `\|`) + " ")
		}
		out.WriteString("|\n")
	}
	line(header)
	out.WriteString(strings.Repeat("|---", len(header)) + "|\n")
	for _, r := range rows {
		line(r)
	}
	return out.String()
}

// codeBlock is a fenced block of lines, or nothing without lines.
func codeBlock(lines []string) string {
	if len(lines) == 0 {
		return ""
	}
	return "```text\n" + strings.Join(lines, "\n") + "\n```\n"
}

// code is s as inline code.
func code(s string) string { return "`" + s + "`" }
